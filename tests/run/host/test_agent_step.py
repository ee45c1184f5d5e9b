"""The host loop's agent program (``jaxmesh.run.agent``, ``packed=True``): its
state's small leaves travel as one buffer of 32-bit words and its per-lane host
inputs as one int32 array; what it computes is the pytree step's, bit for bit.
"""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmesh.core.policy import resolve_policy
from jaxmesh.envs import make_env
from jaxmesh.run import checks
from jaxmesh.run.host import agent_step as run_agent

SHAPES_AND_DTYPES = [
    ((3,), np.bool_),
    ((3, 2), np.int8),
    ((4,), np.uint8),
    ((2, 3), np.float16),
    ((5,), jnp.bfloat16),
    ((2,), np.uint16),
    ((3, 2), np.int32),
    ((), np.int32),
    ((2, 2), np.float32),
    ((2,), np.uint32),
]


def _values(seed: int) -> dict:
    """Random leaves of every dtype, with the awkward bit patterns (negative
    ints, NaN, -0.0, infinities) among them."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, (shape, dtype) in enumerate(SHAPES_AND_DTYPES):
        dt = np.dtype(dtype)
        if dt == np.bool_:
            x = rng.integers(0, 2, shape).astype(bool)
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            x = rng.integers(info.min, info.max, shape, dtype=np.int64).astype(dt)
        else:
            x = rng.normal(size=shape).astype(np.float32)
            flat = x.reshape(-1)
            flat[: min(4, flat.size)] = [np.nan, -0.0, np.inf, -np.inf][: flat.size]
            x = x.astype(dt)
        out[f"leaf{i}"] = x
    # A large leaf stays a buffer of its own.
    out["big"] = rng.normal(size=(run_agent.FLAT_MAX_BYTES // 4 + 1,)).astype(
        np.float32
    )
    return out


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


def test_layout_round_trips_every_dtype_bit_for_bit_under_jit_and_on_the_host():
    state = _values(0)
    layout = run_agent.StateLayout.of(state)
    big = [leaf for leaf in layout.leaves if leaf.index >= 0]
    assert [leaf.shape for leaf in big] == [state["big"].shape]

    flat, rest = jax.jit(layout.pack)(state)
    assert flat.dtype == jnp.uint32 and len(rest) == 1
    on_device = jax.jit(layout.unpack)(flat, rest)
    on_host = layout.unpack(np.asarray(flat), rest, np)
    for name, want in state.items():
        for got in (np.asarray(on_device[name]), np.asarray(on_host[name])):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert _bits(got) == _bits(want), name


def test_layout_refuses_a_state_whose_leaves_changed():
    state = _values(1)
    layout = run_agent.StateLayout.of(state)
    state["leaf6"] = state["leaf6"].astype(np.float32)
    with pytest.raises(TypeError, match="float32"):
        layout.pack(state)


def _chunk_policy(obs, key):
    """A stochastic chunk policy: its actions depend on the lane's key."""
    noise = jax.random.uniform(key, (4, 1), minval=-0.5, maxval=0.5)
    return jnp.clip(jnp.tanh(obs[:1])[None, :] + noise, -1.0, 1.0)


def _plain_chunk_policy(obs):
    """The same without a key: the step indices are then left out."""
    return jnp.clip(jnp.tanh(obs[:1])[None, :] * jnp.arange(1.0, 5.0)[:, None], -1, 1)


@pytest.mark.parametrize(
    "lead, policy", [(0, _chunk_policy), (1, _chunk_policy), (1, _plain_chunk_policy)]
)
def test_packed_step_equals_the_pytree_step(lead, policy):
    """Both programs driven side by side over lanes that start, pause, skip
    and move at their own pace give the same actions and states, bit for bit
    (the pytree step is ``agent.host_step`` on the ``AgentState``)."""
    env = make_env(gymnax.make("Pendulum-v1"))
    n = 5
    settings = checks.check_settings(n, 4, lead, None, None)
    pol = resolve_policy(policy, with_params=False)
    plain = run_agent.agent_functions(pol, env, settings, None)
    packed = run_agent.agent_functions(pol, env, settings, None, packed=True)
    assert plain[0] == packed[0]
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    lanes = np.ones(n, bool)
    a_state, b_state = plain[2](obs, lanes), packed[2](obs, lanes)
    keys = np.array(jax.vmap(jax.random.PRNGKey)(np.arange(n)))
    t = np.zeros(n, np.int32)
    for i in range(12):
        obs = rng.normal(size=(n, 3)).astype(np.float32)
        started = rng.random(n) < 0.2
        active = rng.random(n) < 0.8
        moved = active | (rng.random(n) < 0.5)
        fresh = jax.vmap(jax.random.PRNGKey)(100 * i + np.arange(n))
        keys[started] = np.asarray(fresh)[started]
        t = np.where(started, 0, t)
        skip = np.where(active & (i % 3 == 2), rng.integers(0, 2, n), 0)
        args = (obs, started, active, keys, t, moved if i % 2 else None, skip)
        a_state, a_act = plain[3](None, a_state, *args)
        if i % 3 == 1:  # as the host loop passes them
            args = args[:3] + (packed[3].keys_on_device(keys),) + args[4:]
        b_state, b_act = packed[3](None, b_state, *args)
        assert _bits(np.asarray(a_act)) == _bits(np.asarray(b_act)), i
        for name in ("chunk", "pending", "cursor", "fresh", "prev", "predict_calls"):
            want = np.asarray(getattr(a_state, name))
            assert _bits(np.asarray(getattr(b_state, name))) == _bits(want), name
        t = t + active
