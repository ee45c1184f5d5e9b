"""What the HalfCheetah benchmarks share (realistic.py, hostsim.py, agent_step.py):
the 2x256 tanh MLP (fixed random weights mapping the 17-dim observation to a 6-dim
action in [-1, 1], and an 8-action chunk head on the same trunk), and one timed
``jaxmesh.evaluate`` call."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxmesh

OBS_DIM, ACT_DIM, HIDDEN, K = 17, 6, 256, 8


def init_params(seed: int) -> dict[str, np.ndarray]:
    """Fixed random weights: a 2x256 trunk, a 6-wide head and an 8x6-wide head."""
    rng = np.random.default_rng(seed)

    def dense(fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.normal(0.0, 1.0 / np.sqrt(fan_in), (fan_in, fan_out))
        b = rng.normal(0.0, 0.1, fan_out)
        return w.astype(np.float32), b.astype(np.float32)

    p = {}
    p["w1"], p["b1"] = dense(OBS_DIM, HIDDEN)
    p["w2"], p["b2"] = dense(HIDDEN, HIDDEN)
    p["w3"], p["b3"] = dense(HIDDEN, ACT_DIM)
    p["wc"], p["bc"] = dense(HIDDEN, K * ACT_DIM)
    return p


def trunk(p: Any, obs: jax.Array) -> jax.Array:
    h = jnp.tanh(obs @ p["w1"] + p["b1"])
    return jnp.tanh(h @ p["w2"] + p["b2"])


def act(p: Any, obs: jax.Array) -> jax.Array:
    """One action ([6]) from one observation ([17]); also batched ([n, 17])."""
    return jnp.tanh(trunk(p, obs) @ p["w3"] + p["b3"])


def act_chunk(p: Any, obs: jax.Array) -> jax.Array:
    """A chunk of K actions ([K, 6]) from one observation ([17])."""
    return jnp.tanh(trunk(p, obs) @ p["wc"] + p["bc"]).reshape(K, ACT_DIM)


def jaxmesh_run(policy, env, n, seeds, cap, **kw) -> tuple[dict, np.ndarray]:
    """One ``evaluate`` call, timed whole: env steps per second, the wall
    clock, the env steps, and the returns."""
    t0 = time.perf_counter()
    r = jaxmesh.evaluate(
        policy, env, num_envs=n, seeds=seeds, max_episode_steps=cap, **kw
    )
    wall = time.perf_counter() - t0
    figures = {"sps": r.env_steps / wall, "wall": wall, "steps": float(r.env_steps)}
    return figures, np.asarray(r.returns, np.float64)
