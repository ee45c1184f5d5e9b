"""An Evaluator's later runs start on the buffers its last run ended with.

A run on a JAX env hands its final lane and agent state back to the engine,
and the next run of the same program starts from those buffers with only its
own values (seeds, budget, first lanes) and zero counters put on the device:
putting a whole first carry there costs about 0.1 ms per array, most of a
short run's time. A lane's state is written when it begins an episode, so a
run never sees what the last one left (a chunk half replayed, a prefetched
chunk, frame windows, masked lanes, policy rows).
Checked against the plain loop over gymnax's own functions.
"""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import reference_loop as ref

import jaxmesh
from jaxmesh.adapt import Previous, State
from jaxmesh.core import engine

SPEC = {"obs": State(stack=2), "prev": Previous()}


def chunks(inp, key):
    """Stochastic chunks of 4 over two frames and the previous action."""
    obs, prev = inp["obs"], inp["prev"]
    logit = 10 * obs[-1, 2] + 3 * obs[0, 3] + 2 * (prev - 0.5)
    return jax.random.bernoulli(key, jax.nn.sigmoid(logit), (4,)).astype(jnp.int32)


def inputs(obs_h, act_h, t):
    """What SPEC shows at step t: the last two observations (the first one
    repeated at the start) and the last action (0 before the first)."""
    prev = act_h[t - 1] if t > 0 else jnp.int32(0)
    return {"obs": jnp.stack([obs_h[max(t - 1, 0)], obs_h[t]]), "prev": prev}


def test_later_runs_equal_the_plain_loop(monkeypatch):
    built = []
    first_carry = engine.Engine.first_carry
    monkeypatch.setattr(
        engine.Engine,
        "first_carry",
        lambda self, *a, **k: built.append(1) or first_carry(self, *a, **k),
    )
    reset, step = ref.gymnax_fns(*gymnax.make("CartPole-v1"))
    policy = jax.jit(chunks)
    model = jaxmesh.Model(chunks, spec=SPEC)
    ev = jaxmesh.Evaluator(
        model,
        "gymnax:CartPole-v1",
        num_envs=3,
        horizon=3,
        chunking=jaxmesh.Chunking(prefetch_lead=1),
    )
    # A budget that leaves lanes mid-chunk and masked, then a smaller one
    # (two lanes masked from the start), then the first again.
    rows = []
    for seeds in ([3, 1, 4, 1, 5, 9, 2], [6, 5], [3, 1, 4, 1, 5, 9, 2]):
        got = ev.run(seeds=seeds)
        rows.append(got.policy_rows)
        refs = [
            ref.run_episode(reset, step, policy, s, horizon=3, lead=1, inputs=inputs)
            for s in seeds
        ]
        ref.assert_matches(got, refs)
        lanes, _ = ref.schedule([r.length for r in refs], 3)
        assert got.lanes.tolist() == lanes
        assert got.env_steps == sum(r.length for r in refs)
    assert len(built) == 1  # the later runs started on the kept buffers
    # The policy rows are counted from zero again (the first run's carry
    # was built on the host).
    assert rows[2] == rows[0] and 0 < rows[1] < rows[0]
