"""First-call latency of ``jaxmesh.evaluate`` on CartPole, per episode budget.

Every measurement runs in a fresh Python subprocess (no in-memory jit cache
survives, and JAX's persistent compilation cache is switched off), which:

1. imports jax, flax and jaxmesh (``import s``), then gymnax (``gymnax import
   s``; jaxmesh imports it lazily on the first gymnax env, and gymnax 1.0.1
   imports seaborn, matplotlib and scipy, so it is timed here, not in the call),
2. builds the 2x64 MLP policy (``setup s``: flax init runs a few small ops),
3. calls ``jaxmesh.evaluate`` once (``first call s``, wall clock; its
   ``result.compile_time`` and ``result.run_time`` are reported too),
4. calls it again with the same arguments (``second call s``: compiled code is
   reused, so this is the run alone).

``latency = first call - its result.run_time`` is what the first call costs
beyond running the budget (validation, building the engine, tracing, lowering,
compiling, the initial reset); ``first - second`` is shown as a cross-check (it
is noisier for a long run, as it subtracts two run times). Where the latency
goes is read from JAX's own compile events (``jax.monitoring``): tracing to a
jaxpr, lowering to StableHLO, XLA's compile, for the first call and for the
bare scan alike; "host" is what is left of the latency (checks, shape probes,
the first carry, the result), and "programs" counts XLA compiles. The kernels
of the compiled segment and of the bare scan (their optimized HLO, counted as
``benchmarks/device.py`` does; fusions apart) are what XLA compiles: on a CPU
each fusion is an LLVM module of its own, most of XLA's time. Goal: <= 3 s and
not growing with the budget (the largest budget's latency within 0.5 s of the
smallest's). One discarded subprocess first warms the OS file cache; then budgets
are interleaved (10, 1000, 100000, 10, ...) and each figure is a median over
repeats.

Run: ``python benchmarks/compile.py [--quick]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time


def child(episodes: int, num_envs: int, cache: str | None = None) -> dict:
    """One measurement, run inside a fresh interpreter.

    With ``cache``, jaxmesh's persistent compilation cache is on in that folder
    (``jaxmesh.enable_compile_cache``), as it is for the CLI.
    """
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp
    from common import init_mlp

    import jaxmesh

    phases: dict[str, float] = {}
    programs = [0]

    def on_event(event: str, seconds: float, **_: object) -> None:
        name = PHASES.get(event)
        if name is not None:
            phases[name] = phases.get(name, 0.0) + seconds
            programs[0] += name == "xla"

    jax.monitoring.register_event_duration_secs_listener(on_event)

    if cache:
        jaxmesh.enable_compile_cache(cache)

    ta = time.perf_counter()
    import gymnax  # noqa: F401 - jaxmesh imports it lazily; time it here

    t1 = time.perf_counter()
    module, params = init_mlp((64, 64), 2)

    def mlp_argmax(p, obs):
        return jnp.argmax(module.apply(p, obs)).astype(jnp.int32)

    policy = jaxmesh.Model(mlp_argmax, params=params, name="mlp2x64")
    jax.block_until_ready(params)
    jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # warm-up jit
    phases.clear()
    programs[0] = 0
    # A full garbage collection owed to the imports (~0.1 s) would land in
    # whichever first call crosses the collector's threshold (seen in either
    # one's lowering): both start from a collected heap.
    gc.collect()
    t_bare, c_bare = time.perf_counter(), time.process_time()
    jax.block_until_ready(bare_scan(mlp_argmax, params, num_envs))
    bare_s = time.perf_counter() - t_bare
    bare_cpu = time.process_time() - c_bare
    bare_phases, bare_programs = dict(phases), programs[0]
    phases.clear()
    programs[0] = 0
    gc.collect()
    t2, c2 = time.perf_counter(), time.process_time()
    kwargs = dict(episodes=episodes, num_envs=num_envs)
    first = jaxmesh.evaluate(policy, "gymnax:CartPole-v1", **kwargs)
    t3, c3 = time.perf_counter(), time.process_time()
    first_phases, first_programs = dict(phases), programs[0]
    second = jaxmesh.evaluate(policy, "gymnax:CartPole-v1", **kwargs)
    t4 = time.perf_counter()
    # The kernels each compiled program runs (after the timings: counting the
    # bare scan's compiles it once more).
    from device import count_kernels, jaxmesh_kernels

    bare = make_bare(mlp_argmax, params, num_envs).lower(jax.random.PRNGKey(0))
    kernels = jaxmesh_kernels()
    bare_kernels = count_kernels(bare.compile().as_text())
    return {
        "episodes": episodes,
        "import_s": ta - t0,
        "gymnax_import_s": t1 - ta,
        "setup_s": t2 - t1,
        "first_s": t3 - t2,
        "compile_time": first.compile_time,
        "first_run_time": first.run_time,
        "second_s": t4 - t3,
        "second_compile_time": second.compile_time,
        "env_steps": first.env_steps,
        "bare_first_s": bare_s,
        "first_cpu_s": c3 - c2,
        "bare_cpu_s": bare_cpu,
        **{f"{k}_s": first_phases.get(k, 0.0) for k in PHASES.values()},
        **{f"bare_{k}_s": bare_phases.get(k, 0.0) for k in PHASES.values()},
        "programs": first_programs,
        "bare_programs": bare_programs,
        "kernels": kernels.get("kernels", -1),
        "fusions": kernels.get("fusion", -1),
        "bare_kernels": bare_kernels["kernels"],
        "bare_fusions": bare_kernels["fusion"],
    }


#: JAX's compile events (``jax.monitoring``) and the phase each one is.
PHASES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "xla",
}


def bare_scan(policy, params, n: int, steps: int = 500):
    """The loop people write by hand, called once (compile + run): a jitted
    ``lax.scan`` over the vmapped gymnax CartPole and the same policy, resetting
    finished lanes with ``jnp.where`` each step."""
    import jax

    return make_bare(policy, params, n, steps)(jax.random.PRNGKey(0))


def make_bare(policy, params, n: int, steps: int = 500):
    """``bare_scan``'s jitted program (a function of the key)."""
    import gymnax
    import jax
    import jax.numpy as jnp

    env, env_params = gymnax.make("CartPole-v1")
    reset = jax.vmap(env.reset_env, (0, None))
    step = jax.vmap(env.step_env, (0, 0, 0, None))

    @jax.jit
    def run(key):
        obs, state = reset(jax.random.split(key, n), env_params)

        def body(carry, _):
            obs, state, key, ret = carry
            key, k1, k2 = jax.random.split(key, 3)
            action = jax.vmap(lambda o: policy(params, o))(obs)
            obs2, state2, reward, done, _ = step(
                jax.random.split(k1, n), state, action, env_params
            )
            obs0, state0 = reset(jax.random.split(k2, n), env_params)
            pick = lambda a, b: jnp.where(
                done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b
            )
            obs2 = pick(obs0, obs2)
            state2 = jax.tree.map(pick, state0, state2)
            return (obs2, state2, key, ret + reward), None

        carry = (obs, state, key, jnp.zeros(n))
        return jax.lax.scan(body, carry, None, steps)[0][3]

    return run


def spawn(episodes: int, num_envs: int, cache: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if cache is None:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    else:
        env.pop("JAX_ENABLE_COMPILATION_CACHE", None)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        str(episodes),
        "--num-envs",
        str(num_envs),
    ] + (["--cache", cache] if cache else [])
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(
            f"child for episodes={episodes} failed ({out.returncode}):\n{out.stderr}"
        )
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    rec["process_s"] = wall
    return rec


def main(argv: list[str] | None = None) -> list[dict]:
    """Prints the first-call latency table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--episodes", default="10,1000,100000", help="comma-separated budgets"
    )
    ap.add_argument("--num-envs", type=int, default=64, help="lanes N")
    ap.add_argument("--repeats", type=int, default=3, help="subprocesses per budget")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.num_envs, args.cache)))
        return []
    if args.quick:
        args.repeats = 1
    budgets = [int(e) for e in args.episodes.split(",")]

    from common import goal, header, machine, table

    print(
        header(
            "compile: first-call latency of jaxmesh.evaluate (gymnax CartPole-v1)",
            {
                "N": args.num_envs,
                "policy": "mlp 2x64 (flax, random init)",
                "repeats": args.repeats,
                "jax": machine()["jax"],
                "cpus": machine()["nproc"],
            },
        )
    )
    spawn(budgets[0], args.num_envs)  # warms the OS file cache; discarded
    runs: dict[int, list[dict]] = {e: [] for e in budgets}
    for _ in range(args.repeats):
        for e in budgets:
            runs[e].append(spawn(e, args.num_envs))
    keys = [
        "process_s",
        "import_s",
        "gymnax_import_s",
        "setup_s",
        "first_s",
        "compile_time",
        "first_run_time",
        "second_s",
        "env_steps",
        "bare_first_s",
        "trace_s",
        "lower_s",
        "xla_s",
        "bare_trace_s",
        "bare_lower_s",
        "bare_xla_s",
        "programs",
        "bare_programs",
        "kernels",
        "fusions",
        "bare_kernels",
        "bare_fusions",
    ]
    rows = []
    for e in budgets:
        med = {k: statistics.median(r[k] for r in runs[e]) for k in keys}
        lat = [r["first_s"] - r["first_run_time"] for r in runs[e]]
        med["latency"] = statistics.median(lat)
        med["first_minus_second"] = statistics.median(
            r["first_s"] - r["second_s"] for r in runs[e]
        )
        med["latency_max"] = max(lat)
        # The first call's latency (its run time taken out: the budgets differ
        # from the bare scan's 500 steps) over the bare scan's first call.
        ratios = [
            (r["first_s"] - r["first_run_time"]) / r["bare_first_s"] for r in runs[e]
        ]
        med["ratio"] = statistics.median(ratios)
        med["ratio_range"] = f"{min(ratios):.2f}-{max(ratios):.2f}"
        # The same in CPU seconds of the process (XLA's compile threads
        # included): less moved by other jobs on the machine than the wall clock.
        cpu = [
            (r["first_cpu_s"] - r["first_run_time"]) / r["bare_cpu_s"] for r in runs[e]
        ]
        med["cpu_ratio"] = statistics.median(cpu)
        med["cpu_range"] = f"{min(cpu):.2f}-{max(cpu):.2f}"
        med["episodes"] = e
        med["recompiled_on_second"] = any(r["second_compile_time"] > 0 for r in runs[e])
        rows.append(med)
    print(
        table(
            [
                "episodes",
                "env steps",
                "process s",
                "import s",
                "gymnax import s",
                "setup s",
                "first call s",
                "result.compile_time s",
                "result.run_time s (1st)",
                "second call s",
                "first - second s",
                "latency s (median)",
                "latency s (max)",
                "bare scan first call s",
                "latency / bare first call",
                "2nd call recompiled",
            ],
            [
                [
                    r["episodes"],
                    int(r["env_steps"]),
                    r["process_s"],
                    r["import_s"],
                    r["gymnax_import_s"],
                    r["setup_s"],
                    r["first_s"],
                    r["compile_time"],
                    r["first_run_time"],
                    r["second_s"],
                    r["first_minus_second"],
                    r["latency"],
                    r["latency_max"],
                    r["bare_first_s"],
                    r["ratio"],
                    "yes" if r["recompiled_on_second"] else "no",
                ]
                for r in rows
            ],
        )
    )
    for r in rows:
        r["host_s"] = r["latency"] - r["trace_s"] - r["lower_s"] - r["xla_s"]
    print("\nWhere the first call's latency goes (medians, s), bare scan beside:\n")
    print(
        table(
            [
                "episodes",
                "latency",
                "trace",
                "lower",
                "XLA compile",
                "host",
                "programs",
                "bare first call",
                "bare trace",
                "bare lower",
                "bare XLA compile",
                "bare programs",
            ],
            [
                [
                    r["episodes"],
                    r["latency"],
                    r["trace_s"],
                    r["lower_s"],
                    r["xla_s"],
                    r["host_s"],
                    int(r["programs"]),
                    r["bare_first_s"],
                    r["bare_trace_s"],
                    r["bare_lower_s"],
                    r["bare_xla_s"],
                    int(r["bare_programs"]),
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nThe first call against the bare scan's (ratios: median and range over "
        "repeats; CPU: the process's CPU seconds, XLA's threads included), and the "
        "kernels of the compiled programs (optimized HLO, as benchmarks/device.py "
        "counts them):\n"
    )
    print(
        table(
            [
                "episodes",
                "latency / bare",
                "range",
                "CPU / bare CPU",
                "range",
                "segment kernels",
                "segment fusions",
                "bare kernels",
                "bare fusions",
            ],
            [
                [
                    r["episodes"],
                    r["ratio"],
                    r["ratio_range"],
                    r["cpu_ratio"],
                    r["cpu_range"],
                    int(r["kernels"]),
                    int(r["fusions"]),
                    int(r["bare_kernels"]),
                    int(r["bare_fusions"]),
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nlatency = first call - its result.run_time (goal <= 3 s, flat in the "
        "budget). "
        "Fresh subprocess per measurement; medians over repeats.\n"
    )
    for r in rows:
        lat = r["latency"]
        print(goal(f"compile latency <= 3 s [episodes={r['episodes']}]", lat, lat <= 3))
        ratio = r["ratio"]
        text = (
            "first-call latency / bare scan first call <= 1.2 "
            f"[episodes={r['episodes']}]"
        )
        print(goal(text, ratio, ratio <= 1.2))
    # "Not growing with the budget": the largest budget's latency stays within
    # 0.5 s of the smallest budget's (the machine's noise is about that).
    growth = rows[-1]["latency"] - rows[0]["latency"]
    text = (
        f"compile latency growth episodes {rows[0]['episodes']} -> "
        f"{rows[-1]['episodes']} <= 0.5 s"
    )
    print(goal(text, growth, growth <= 0.5))
    # A second process with the persistent cache (what `jaxmesh eval` does by
    # default): two fresh processes share one cache folder.
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        first, second = (spawn(budgets[0], args.num_envs, folder) for _ in range(2))
    print(
        "\nPersistent compilation cache (jaxmesh.enable_compile_cache), episodes="
        f"{budgets[0]}: first process's first call {first['first_s']:.2f} s "
        f"(compile {first['compile_time']:.2f} s); second process's first call "
        f"{second['first_s']:.2f} s (compile {second['compile_time']:.2f} s)"
    )
    ratio = second["first_s"] / max(first["first_s"], 1e-9)
    print(
        goal(
            "second process's first call / first process's (cache)", ratio, ratio < 0.5
        )
    )
    return rows


if __name__ == "__main__":
    main()
