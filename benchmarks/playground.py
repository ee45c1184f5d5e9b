"""MuJoCo Playground's CartpoleBalance (MJX, ``impl="jax"``), three evaluators side
by side at N = 1, 16 and 256 lanes.

One run, one process, the same env, policy (a fixed linear controller, tanh of
W @ obs) and episodes (N episodes of ``--length`` steps, episode i reset with
``PRNGKey(i)``):

1. ``playground loop``: Playground's own final evaluation
   (``learning/train_jax_ppo.py``): a jitted ``env.reset`` and ``env.step``
   (here vmapped over N lanes) and a jitted policy, driven step by step from
   Python until every lane is done or the episode length is reached. Every
   ratio is to this row.
2. ``brax Evaluator``: ``brax.training.acting.Evaluator`` over the env wrapped
   as Playground trains it (``wrap_for_brax_training``): one jitted unroll of
   ``episode_length`` steps for N lanes (its reset keys are split from its own
   key, so its returns are other episodes' and are not compared).
3. ``jaxmesh``: ``jaxmesh.Evaluator(policy, env, num_envs=N).run(seeds=range(N))``.

``first call s`` is the first call's wall clock (tracing and compiling
included); then ``--repeats`` interleaved timed calls, medians, env steps per
second of wall clock. jaxmesh's per-episode returns are checked against the
Playground loop's (same keys, same episodes).

Run: ``python benchmarks/playground.py [--lanes 1 16 256] [--length 100]``
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import header, machine, median, table

import jaxmesh
from jaxmesh.envs import make_env

NAME = "CartpoleBalance"
W = jnp.array([[0.3, -0.5, 2.0, 0.4, 0.6]])
LOOP, BRAX, MESH = "playground loop", "brax Evaluator", "jaxmesh"


def policy(obs):
    return jnp.tanh(obs @ W.T) if obs.ndim > 1 else jnp.tanh(W @ obs)


def playground_loop(env, n: int, length: int):
    """Playground's evaluation loop over n lanes: returns a run() -> returns."""
    reset = jax.jit(jax.vmap(env.reset))
    step = jax.jit(jax.vmap(env.step))
    act = jax.jit(policy)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(n))

    def run():
        state = reset(keys)
        ret = np.zeros(n, np.float32)
        alive = np.ones(n, bool)
        for _ in range(length):
            state = step(state, act(state.obs))
            ret += np.where(alive, np.asarray(state.reward), 0.0)
            alive &= ~(np.asarray(state.done) > 0.5)
            if not alive.any():
                break
        return ret

    return run


def brax_evaluator(env, n: int, length: int):
    from brax.training import acting
    from mujoco_playground import wrapper

    wrapped = wrapper.wrap_for_brax_training(env, episode_length=length)

    def make_policy(params):
        return lambda obs, key: (jnp.tanh(obs @ params.T), {})

    ev = acting.Evaluator(
        wrapped,
        make_policy,
        num_eval_envs=n,
        episode_length=length,
        action_repeat=1,
        key=jax.random.PRNGKey(0),
    )
    return lambda: ev.run_evaluation(W, training_metrics={})


def jaxmesh_run(env, n: int):
    ev = jaxmesh.Evaluator(policy, env, num_envs=n)
    return lambda: ev.run(seeds=range(n)).returns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lanes", type=int, nargs="+", default=[1, 16, 256])
    p.add_argument("--length", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    overrides = {"episode_length": args.length}
    env = make_env(f"playground:{NAME}", config_overrides=overrides)
    print(header(f"Playground {NAME} (impl=jax)", vars(args)))
    print(machine())
    rows = []
    for n in args.lanes:
        makers = {
            LOOP: lambda n=n: playground_loop(env.env, n, args.length),
            BRAX: lambda n=n: brax_evaluator(env.env, n, args.length),
            MESH: lambda n=n: jaxmesh_run(env, n),
        }
        runs, first = {}, {}
        for name, make in makers.items():
            t0 = time.perf_counter()
            runs[name] = make()
            jax.block_until_ready(runs[name]())
            first[name] = time.perf_counter() - t0
            print(f"N={n} {name}: first call {first[name]:.1f} s", flush=True)
        ref, got = runs[LOOP](), runs[MESH]()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)
        times = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                t0 = time.perf_counter()
                jax.block_until_ready(run())
                times[name].append(time.perf_counter() - t0)
        steps = n * args.length
        base = steps / median(times[LOOP])
        for name in runs:
            sps = steps / median(times[name])
            rows.append([n, name, sps, sps / base, first[name]])
    headers = ["N", "evaluator", "env steps/s", "x playground loop", "first call s"]
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
