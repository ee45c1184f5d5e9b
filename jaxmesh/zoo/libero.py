"""A scripted LIBERO-Spatial policy: the whole flow (configs/libero_spatial.yaml).

``scripted`` reads four LIBERO state keys and returns ``CHUNK`` identical
7-number actions (end-effector deltas, gripper -1 open / +1 closed): it grasps
the first bowl and tries to carry it over the plate. It nearly always fails
(the bowl slips): its scores check the pipeline, not a baseline.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmesh.adapt import State
from jaxmesh.model import Model

#: Actions per plan (the config executes ``horizon`` of them).
CHUNK = 5
KEYS = (
    "robot0_eef_pos",
    "robot0_gripper_qpos",
    "akita_black_bowl_1_pos",
    "plate_1_pos",
)


def _toward(target: jnp.ndarray, at: jnp.ndarray, gain: float = 10.0) -> jnp.ndarray:
    return jnp.clip(gain * (target - at), -1.0, 1.0)


def _act(obs: dict) -> jnp.ndarray:
    eef, fingers = obs["robot0_eef_pos"], obs["robot0_gripper_qpos"]
    bowl, plate = obs["akita_black_bowl_1_pos"], obs["plate_1_pos"]
    opening = fingers[0] - fingers[1]
    near_xy = jnp.linalg.norm(eef[:2] - bowl[:2]) < 0.015
    grasp_at = bowl + jnp.array([0.0, 0.0, 0.015])
    at_grasp = jnp.linalg.norm(eef - grasp_at) < 0.015
    holding = (opening < 0.07) & (jnp.linalg.norm(eef - bowl) < 0.06)
    lifted = bowl[2] > plate[2] + 0.06
    over_plate = jnp.linalg.norm(bowl[:2] - plate[:2]) < 0.02
    above_bowl = bowl + jnp.array([0.0, 0.0, 0.10])
    above_plate = plate + jnp.array([0.0, 0.0, 0.15])
    target = jnp.where(
        holding,
        jnp.where(lifted, above_plate, eef + jnp.array([0.0, 0.0, 0.05])),
        jnp.where(near_xy, grasp_at, above_bowl),
    )
    close = jnp.where(holding, ~(over_plate & lifted), at_grasp)
    grip = jnp.where(close, 1.0, -1.0)
    move = _toward(target, eef)
    return jnp.concatenate([move, jnp.zeros(3), grip[None]]).astype(jnp.float32)


def chunk(obs: dict) -> jnp.ndarray:
    """One plan: ``CHUNK`` copies of the action for ``obs``."""
    return jnp.broadcast_to(_act(obs), (CHUNK, 7))


#: The policy the config runs: a Model reading four state leaves (only they
#: leave the env's process), a chunk of ``CHUNK`` actions per plan, declared
#: (served over openpi's protocol, one observation gets ``[CHUNK, 7]``).
scripted = Model(chunk, spec={k: State(key=k) for k in KEYS}, native_chunk=CHUNK)
