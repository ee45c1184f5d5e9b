"""A model-based Pendulum controller that plans chunks (configs/pendulum.yaml).

``planner`` rolls gymnax ``Pendulum-v1``'s equations (with a wrong mass)
``CHUNK`` steps forward: an energy-pumping swing-up, a PD hold near upright.
An open-loop plan, so a larger horizon or a delay costs return, the grid
``jaxmesh sweep`` scores. No learned policy: it shows the flow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmesh.model import Model

#: Actions per plan (a run executes ``horizon`` of them).
CHUNK = 12
#: gymnax Pendulum-v1's constants, but for the bob's mass: the planner's model
#: is off (a bob 40% heavier), so a plan drifts the longer it plays open loop.
G, M, L, DT, MAX_SPEED, MAX_TORQUE = 10.0, 1.4, 1.0, 0.05, 8.0, 2.0


def _torque(th: jax.Array, th_dot: jax.Array) -> jax.Array:
    """Swing up by pumping energy, hold with a PD law near upright (th = 0)."""
    th = jnp.mod(th + jnp.pi, 2 * jnp.pi) - jnp.pi
    energy = 0.5 * th_dot**2 + 1.5 * G / L * (jnp.cos(th) - 1.0)
    pump = jnp.sign(th_dot + 1e-3) * jnp.clip(-0.5 * energy, 0.0, MAX_TORQUE)
    hold = -(8.0 * th + 1.5 * th_dot)
    near = jnp.cos(th) > 0.9
    return jnp.clip(jnp.where(near, hold, pump), -MAX_TORQUE, MAX_TORQUE)


def plan(obs: jax.Array) -> jax.Array:
    """One plan: ``[CHUNK, 1]`` torques along the predicted states."""
    th0, th_dot0 = jnp.arctan2(obs[1], obs[0]), obs[2]

    def step(state, _):
        th, th_dot = state
        u = _torque(th, th_dot)
        th_dot = th_dot + (1.5 * G / L * jnp.sin(th) + 3.0 / (M * L**2) * u) * DT
        th_dot = jnp.clip(th_dot, -MAX_SPEED, MAX_SPEED)
        return (th + th_dot * DT, th_dot), u

    _, torques = jax.lax.scan(step, (th0, th_dot0), None, length=CHUNK)
    return torques[:, None].astype(jnp.float32)


#: The policy the config runs: a chunk of ``CHUNK`` torques per plan.
planner = Model(plan, native_chunk=CHUNK, name="pendulum-planner")
