"""One agent step of a host-stepped run against a hand loop's jitted policy call.

The workload of ``realistic.py``'s in-process rows: 16 gymnasium
``HalfCheetah-v5`` lanes, a 2x256 tanh MLP over [16, 17] float32 observations,
horizon 1. Contenders, per call, in microseconds (median over ``--calls``
calls, interleaved in blocks), each with its ratio to the hand call:

(a) ``hand``: ``np.asarray(policy_jit(params, obs))``, the hand loop's call
    (params put on the device once, as ``realistic.batched_policy`` does);
(b) ``jaxmesh``: ``HostLoop.agent_step`` + ``HostLoop.read_actions``, the
    program built as ``jaxmesh.run.host`` builds it (``_host_agent`` over the
    lanes' spec, ``pol.default_params()`` as ``evaluate`` passes them) and
    driven as ``LocalRun.lockstep`` drives it (every lane active, none started).

and the breakdown of (b):

(c) ``program alone``: (b)'s jitted program called with its inputs built
    beforehand (its state buffer, the lane masks in one array): (b) less the
    host side (building the inputs, the loop's bookkeeping);
(d) ``pytree program``: the same ``agent.host_step`` jitted over the
    ``AgentState`` pytree and the host inputs as separate arrays
    (``make_agent``'s program: a buffer per state leaf and per input);
(e) ``hand, in a tile loop``: (a)'s policy inside a ``while_loop`` over the
    tiles to plan, as the agent's plan compaction runs it (``core.tiles``):
    what that loop alone costs XLA:CPU.

No env is stepped: the observations are the lanes' reset observations, so the
figures are the agent step alone. No thread environment variable is set.
``--env`` steps every env between calls (untimed), as a run does: caches and
the runtime's threads are then as cold as in a run.

Run: ``python benchmarks/agent_step.py [--calls 5000] [--lanes 16] [--env]``
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import mlp
import numpy as np
from mlp import ACT_DIM, act

import jaxmesh
from jaxmesh.core import tally as core_results
from jaxmesh.core import tiles
from jaxmesh.core.policy import resolve_policy
from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.run import checks
from jaxmesh.run.host import agent_step as run_agent
from jaxmesh.run.host import driver as run_host
from jaxmesh.run.host.loop import HostLoop, HostRun


def init_params(seed: int) -> dict[str, np.ndarray]:
    """``mlp.init_params`` without the chunk head (a one-action policy)."""
    return {k: v for k, v in mlp.init_params(seed).items() if k not in ("wc", "bc")}


def _host_loop(policy: Any, envs: list, n: int) -> tuple[HostLoop, Any]:
    """A ``HostLoop`` over ``envs`` with the program ``host.run_host`` builds;
    every lane active at its reset observation, the state initialised."""
    lanes = gym_lanes.make_lanes(envs, n, n)
    settings = checks.check_settings(n, 1, 0, None, None)
    pol = resolve_policy(policy, with_params=False)
    params = pol.default_params()
    host_agent = run_host._host_agent(policy, pol, lanes.spec, settings, False, None)
    program = host_agent.program(params)
    host_agent.compile(params)
    seeds = np.arange(n, dtype=np.int64)
    res = core_results.empty(n, n, np)
    stub = types.SimpleNamespace(steps=None)
    run = HostRun(program, params, lanes, settings, seeds, stub)
    loop = HostLoop(run, res, stub, None)
    for j, env in enumerate(envs[:n]):
        loop.obs[j] = env.reset(seed=j)[0]
    loop.active[:] = True
    loop.episode[:] = np.arange(n)
    loop.ep_keys[:] = run_host.episode_keys(seeds)
    loop.state = program.init(loop.obs, loop.active.copy())
    return loop, lanes


def _breakdown(loop: HostLoop, policy: Any, params: Any, obs: np.ndarray) -> dict:
    """The contenders (c), (d) and (e) of the module's docstring."""
    n, program = loop.n, loop.program
    step = program.step  # a run.agent.PackedStep
    keys = step.keys_on_device(loop.ep_keys)
    sig, masks, counts = step.host_inputs(loop.started, loop.active, loop.t)
    fn = step.program(sig, loop.state.layout)
    texts: dict = {}
    agent_obs = loop.agent_obs
    flat = [loop.state.flat, loop.state.big]

    def program_alone() -> np.ndarray:
        flat[0], flat[1], actions = fn(
            loop.params, flat[0], flat[1], agent_obs, masks, counts, keys, texts
        )
        return np.asarray(actions)

    # make_agent's program: the AgentState pytree, the inputs one by one.
    pol = resolve_policy(policy, with_params=False)
    settings = checks.check_settings(n, 1, 0, None, None)
    _, _, init, pytree_step, _ = run_agent.agent_functions(
        pol, loop.spec, settings, pol.default_params()
    )
    tree = [init(agent_obs, loop.active.copy())]

    def pytree_program() -> np.ndarray:
        tree[0], actions = pytree_step(
            loop.params,
            tree[0],
            agent_obs,
            loop.started,
            loop.active,
            loop.ep_keys,
            loop.t,
            None,
            None,
            texts,
        )
        return np.asarray(actions)

    # The hand call's policy inside the plan's tile loop (core.tiles).
    tile = program.config.tile

    def tiled(p: Any, o: Any, need: Any) -> Any:
        def body(idx: Any, buf: Any) -> Any:
            out = jax.vmap(act, in_axes=(None, 0))(p, tiles.take(o, idx))
            return tiles.put(buf, idx, out)

        buf = jnp.zeros((n, ACT_DIM), jnp.float32)
        return tiles.for_each_tile(need, tile, body, buf)[0]

    tiled_jit = jax.jit(tiled)
    need = np.ones(n, bool)
    dev_params = jax.device_put(params)

    def hand_tiled() -> np.ndarray:
        return np.asarray(tiled_jit(dev_params, obs, need))

    return {
        "program alone": program_alone,
        "pytree program": pytree_program,
        "hand, in a tile loop": hand_tiled,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000, help="timed calls each")
    ap.add_argument(
        "--block", type=int, default=250, help="calls per interleaved block"
    )
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--env", action="store_true", help="step every env between calls (untimed)"
    )
    ap.add_argument("--no-breakdown", action="store_true", help="time (a) and (b) only")
    args = ap.parse_args()
    n = args.lanes

    params = init_params(args.seed)
    policy = jaxmesh.Model(act, params=params, name="mlp2x256_tanh")
    envs = [gym.make("HalfCheetah-v5") for _ in range(n)]
    loop, lanes = _host_loop(policy, envs, n)

    fn = jax.jit(act)
    dev_params = jax.device_put(params)
    obs = np.array(loop.obs, np.float32)

    def hand() -> np.ndarray:
        return np.asarray(fn(dev_params, obs))

    def jaxmesh_step(run: HostLoop) -> np.ndarray:
        device = run.agent_step(run.started, run.active, None)
        actions, _ = run.read_actions(device)
        run.started[:] = False
        return actions

    contenders = {"hand": hand, "jaxmesh": lambda: jaxmesh_step(loop)}
    if not args.no_breakdown:
        # Its own loop: the program alone donates that loop's state.
        other, _ = _host_loop(policy, envs, n)
        contenders.update(_breakdown(other, policy, params, obs))
    ref = hand()
    same = {k: np.array_equal(f(), ref) for k, f in contenders.items()}
    for f in contenders.values():  # warm up
        for _ in range(200):
            f()
    idle = np.zeros(ACT_DIM, np.float32)

    def between() -> None:  # what a run does between agent steps (untimed)
        if args.env:
            for env in envs:
                env.step(idle)

    times: dict[str, list[float]] = {k: [] for k in contenders}
    clock = time.perf_counter_ns
    for _ in range(max(1, args.calls // args.block)):
        for name, f in contenders.items():
            out = times[name]
            for _ in range(args.block):
                between()
                t0 = clock()
                f()
                out.append((clock() - t0) / 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    p10 = {k: float(np.percentile(v, 10)) for k, v in times.items()}
    print(
        f"agent step: {n} HalfCheetah-v5 lanes, 2x256 tanh MLP, horizon 1, "
        f"jax {jax.__version__}, {len(times['hand'])} calls each"
    )
    print(f"actions identical to the hand call's: {same}")
    print(f"envs stepped between calls (untimed): {args.env}")
    for k in contenders:
        print(
            f"  {k:24s} median {med[k]:8.1f} us   p10 {p10[k]:8.1f} us"
            f"   ratio to hand {med[k] / med['hand']:.2f}"
        )
    lanes.close()
    for e in envs:
        e.close()


if __name__ == "__main__":
    main()
