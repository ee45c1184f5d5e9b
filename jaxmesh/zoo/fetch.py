"""gymnasium-robotics' Fetch tasks as flat observations, and a scripted policy.

Importing this module registers ``FetchReachFlat-v4``, ``FetchPushFlat-v4`` and
``FetchPickAndPlaceFlat-v4``: the Fetch task with its dict observation
flattened (keys sorted: ``achieved_goal`` (3), ``desired_goal`` (3),
``observation`` (10 for Reach, else 25)), named e.g.
``"gymnasium:jaxmesh.zoo.fetch:FetchPushFlat-v4"``; ``pip install
'jaxmesh[robot]'``. ``scripted`` is a hand-written controller (reach the goal;
push the block along the table, never grasping), a known baseline for
``configs/fetch_suite.yaml``.
"""

from __future__ import annotations

import gymnasium as gym
import jax.numpy as jnp

#: The flat ids this module registers -> the gymnasium-robotics task each wraps.
TASKS = {
    "FetchReachFlat-v4": "FetchReach-v4",
    "FetchPushFlat-v4": "FetchPush-v4",
    "FetchPickAndPlaceFlat-v4": "FetchPickAndPlace-v4",
}

#: Flat observation width of Reach (3 + 3 + 10); Push and PickAndPlace have 31.
REACH_WIDTH = 16
#: Metres the block's centre is from the pushing fingers when they touch it.
PUSH_OFFSET = 0.05
#: Gain from a position error (metres) to an action (clipped to [-1, 1]; one
#: action unit moves the gripper about 5 cm per step).
GAIN = 10.0


def make_flat(task: str, **kwargs):
    """``gymnasium.make(task)`` with its dict observation flattened."""
    import gymnasium_robotics  # the [robot] extra

    gym.register_envs(gymnasium_robotics)
    return gym.wrappers.FlattenObservation(gym.make(task, **kwargs))


def register() -> None:
    """Registers the flat ids of ``TASKS`` (idempotent)."""
    for name, task in TASKS.items():
        if name not in gym.registry:
            gym.register(name, entry_point=make_flat, kwargs={"task": task})


def _toward(target: jnp.ndarray, grip: jnp.ndarray) -> jnp.ndarray:
    return jnp.clip(GAIN * (target - grip), -1.0, 1.0)


def scripted(obs: jnp.ndarray) -> jnp.ndarray:
    """One flat Fetch observation -> one action (dx, dy, dz, gripper).

    Reach: straight to the goal. Push and PickAndPlace: go above the point
    behind the block (on the far side from the goal), descend to the block's
    height, then push along the block-to-goal line; the gripper stays closed.
    """
    goal, o = obs[3:6], obs[6:]
    grip = o[0:3]
    reach = jnp.concatenate([_toward(goal, grip), jnp.zeros(1)])
    if obs.shape[-1] == REACH_WIDTH:
        return reach
    block = o[3:6]
    line = (goal - block).at[2].set(0.0)
    direction = line / (jnp.linalg.norm(line) + 1e-6)
    behind = block - PUSH_OFFSET * direction
    rel = (block - grip).at[2].set(0.0)
    along = jnp.dot(rel, direction)
    off_line = jnp.linalg.norm(rel - along * direction)
    low = jnp.abs(grip[2] - block[2]) < 0.01
    # Behind the block, on the line to the goal, at its height: push through it.
    pushing = (along > 0.02) & (off_line < 0.012) & low
    push = _toward(goal - (PUSH_OFFSET - 0.01) * direction, grip)
    # Otherwise: above the point behind the block, then down onto the table.
    over = jnp.linalg.norm((behind - grip).at[2].set(0.0)) < 0.01
    target = behind.at[2].set(jnp.where(over, block[2], block[2] + 0.06))
    move = jnp.where(pushing, push, _toward(target, grip))
    return jnp.concatenate([move, -jnp.ones(1)])


register()
