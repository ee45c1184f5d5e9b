"""Device check: jaxmesh.evaluate against a bare ``jax.lax.scan`` on the accelerator.

One script for whatever accelerator JAX sees (it runs on a CPU too, where the
figures only show that it works). It prints ``jax.devices()``, the backend,
the device kind and the jax/jaxlib versions, then, per workload, at N = 4,096
lanes (``--num-envs``):

1. **steps/s ratio**: ``jaxmesh.evaluate``'s env steps/s over a bare
   ``lax.scan``'s, the same env steps on both sides, warm calls, interleaved
   repeats, medians. ``ratio`` uses ``result.steps_per_second`` (env steps /
   ``run_time``), ``ratio (wall)`` the whole ``evaluate`` call's wall clock;
   the bare scan's figure is its jitted call's wall clock either way.
2. **first call**: the wall clock of the first ``evaluate`` (validation,
   tracing, compiling and the run) and of the bare scan's first call (tracing,
   compiling and the run), and their ratio.
3. **kernels**: the XLA kernels in jaxmesh's compiled segment program against
   the bare scan's compiled program, counted in the optimized HLO text
   (``Compiled.as_text()``): every instruction of the computations that run as
   control flow (the entry, ``while`` bodies and conditions, ``conditional``
   branches, ``call`` targets), fused bodies and reducers left out, less the
   free ones (parameter, constant, tuple, get-tuple-element, bitcast, ...);
   ``while`` and ``conditional`` themselves are counted apart. It is the size
   of the program, not the launches per step.

Workloads:

- ``cartpole-random``, ``cartpole-balancing``: gymnax CartPole-v1 with the 2x64
  flax MLP of ``overhead.py`` (random init: ~10-step episodes; hand-set
  balancing weights: every episode 500 steps). The bare scan is
  ``overhead.make_bare`` (one batched forward, gymnax's auto-resetting
  ``env.step`` vmapped over the lanes), run for ``env_steps / N`` steps of the
  jaxmesh run, whose budget is sized to take ``--seconds``. Returns checked:
  balancing, every jaxmesh episode returns 500 and the bare scan's reward sum
  per finished episode is 500; random init, jaxmesh's mean return is within 5%
  of the bare scan's reward sum per finished episode (other keys: the episodes
  differ, so only their mean is comparable).
  First call: the bare scan runs 500 steps, jaxmesh one episode per lane (the
  same work in the balancing regime; in the random one jaxmesh runs fewer
  steps, both small beside the compile).
- ``playground``: MuJoCo Playground CartpoleBalance (MJX, ``impl="jax"``,
  ``episode_length`` = ``--length``) with ``playground.py``'s linear tanh
  controller. The bare scan resets lane i with ``PRNGKey(i)`` (for
  ``--episodes-per-lane`` k > 1, episode j*N + i is lane i's j-th) and scans
  ``env.step`` vmapped over the N lanes for ``--length`` steps per episode,
  summing each lane's rewards until ``done``; jaxmesh runs ``seeds=range(k*N)``.
  Both run the same N*k*length env steps, and every episode's return is checked
  equal (``rtol=1e-4, atol=1e-3``, as ``playground.py`` does). The first calls
  run the whole budget. Skipped, with a message, when ``mujoco_playground`` is
  not importable.

Each workload runs in its own subprocess (JAX's persistent compilation cache
off, so a first call compiles), under a time limit: ``--part-seconds`` each,
and all within ``--time-limit`` (a workload that would start past it is
skipped; one that runs past its limit is killed and reported). The parent
process never touches the accelerator (a GPU's memory is preallocated by one
process at a time), the children report the devices.

Goal: evaluate >= 0.95x the bare scan's env steps/s on the accelerator.

Run: ``python benchmarks/device.py [--quick] [--parts cartpole-random,...]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

PARTS = ("cartpole-random", "cartpole-balancing", "playground")

#: HLO opcodes that launch no kernel (``while``/``conditional`` are counted apart).
FREE = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "opt-barrier",
    "after-all",
    "add-dependency",
    "partition-id",
    "replica-id",
    "call",
    "domain",
}


# The compiled programs ----------------------------------------------------------
def _opcode(rhs: str) -> str:
    """The opcode of an HLO instruction's right-hand side ``shape opcode(...)``."""
    end = rhs.find(" ")
    if rhs.startswith("("):  # a tuple shape: skip its balanced parentheses
        depth, end = 0, 0
        while end < len(rhs):
            depth += (rhs[end] == "(") - (rhs[end] == ")")
            end += 1
            if depth == 0:
                break
    m = re.match(r"\s*([a-z][\w\-]*)\(", rhs[end:])
    return m.group(1) if m else "?"


def count_kernels(hlo: str) -> dict[str, int]:
    """Kernels of a compiled HLO module's text (``Compiled.as_text()``): the
    instructions of the computations run as control flow (entry, while body and
    condition, conditional branches, call targets; not fused bodies or
    reducers), less the free ones; ``fusion``, ``custom-call``, ``while``,
    ``conditional`` apart."""
    comps: dict[str, list[tuple[str, str]]] = {}
    entry, name = None, None
    for line in hlo.splitlines():
        if not line.strip() or line.startswith(("HloModule", "//")):
            continue
        if not line[0].isspace() and line.rstrip().endswith("{"):
            words = line.split()
            is_entry = words[0] == "ENTRY"
            name = (words[1] if is_entry else words[0]).lstrip("%")
            comps[name] = []
            entry = name if is_entry else entry
            continue
        if line.startswith("}"):
            name = None
            continue
        if name is None or " = " not in line:
            continue
        rhs = line.split(" = ", 1)[1]
        comps[name].append((_opcode(rhs), rhs))
    if entry is None:
        return {}
    refs = re.compile(
        r"(?:body|condition|true_computation|false_computation)=%?([\w.\-]+)"
    )
    seen, todo = set(), [entry]
    while todo:
        c = todo.pop()
        if c in seen or c not in comps:
            continue
        seen.add(c)
        for op, rhs in comps[c]:
            todo += refs.findall(rhs)
            m = re.search(r"branch_computations=\{([^}]*)\}", rhs)
            if m:
                todo += [b.strip().lstrip("%") for b in m.group(1).split(",")]
            if op in ("call", "async-start"):
                todo += re.findall(r"(?:to_apply|calls)=%?([\w.\-]+)", rhs)
    ops = [op for c in seen for op, _ in comps[c]]
    kernels = [op for op in ops if op not in FREE | {"while", "conditional"}]
    return {
        "kernels": len(kernels),
        "fusion": ops.count("fusion"),
        "custom-call": ops.count("custom-call"),
        "while": ops.count("while"),
        "conditional": ops.count("conditional"),
    }


def jaxmesh_segments() -> list:
    """The compiled segment programs of the evaluators ``jaxmesh.evaluate`` kept
    (private: ``jaxmesh.run.scan.evaluator._EVALUATORS``, each ``Evaluator``'s
    ``_programs`` values' ``segment``, a ``jax.stages.Compiled``)."""
    from jaxmesh.run.scan import evaluator

    return [
        p.segment
        for ev in evaluator._EVALUATORS
        for p in ev._programs.values()
        if p.segment is not None
    ]


def jaxmesh_kernels() -> dict:
    try:
        segs = jaxmesh_segments()
    except (ImportError, AttributeError) as e:
        return {"error": f"jaxmesh's compiled segment not reachable: {e!r}"}
    if len(segs) != 1:
        return {"error": f"expected one compiled segment, found {len(segs)}"}
    return count_kernels(segs[0].as_text())


def device_info() -> dict:
    from importlib.metadata import version

    import jax

    d = jax.devices()
    return {
        "jax.devices()": repr(d),
        "backend": jax.default_backend(),
        "device kind": d[0].device_kind,
        "device count": len(d),
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
    }


# The workloads (each in a child process) -----------------------------------------
def sized(run, n: int, seconds: float) -> int:
    """An episode budget (a multiple of ``n``) whose warm ``run(episodes)``
    takes about ``seconds`` of ``run_time``: grown until a run takes a fifth of
    it, then scaled (after a discarded warm-up call; ``common.size_budget``
    keeps a budget whose first run took half the target, which a noisy shared
    CPU makes of a tiny one)."""
    e = n
    run(e)  # a warm-up: the call after the first is often slow
    while True:
        t = max(run(e).run_time, 1e-6)
        if t >= 0.2 * seconds or e >= n * 2**20:
            break
        e *= int(min(64, max(2, 0.5 * seconds / t)))
    return n * max(1, round(e * seconds / t / n))


def cartpole(args, regime: str) -> dict:
    import jax
    import numpy as np
    from common import balancing_params, init_mlp, interleave, timed
    from overhead import ENV_ID, make_bare, make_policy

    import jaxmesh

    n = args.num_envs
    env = f"gymnax:{ENV_ID}"
    module, params = init_mlp((64, 64), 2)
    if regime == "balancing":
        params = balancing_params(params)
    jax.block_until_ready(params)
    policy = make_policy(module, params, f"mlp2x64-{regime}")
    import gymnax  # noqa: F401 - imported before either first call is timed

    jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # the backend is up
    key = jax.random.PRNGKey(1)

    # First calls: the bare scan (500 steps), then evaluate (one episode a lane).
    t0 = time.perf_counter()
    jax.block_until_ready(make_bare(module, n, 500)(params, key))
    bare_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = jaxmesh.evaluate(policy, env, num_envs=n, episodes=n)
    mesh_first = time.perf_counter() - t0

    def evaluate(episodes):
        return jaxmesh.evaluate(policy, env, num_envs=n, episodes=episodes)

    episodes = sized(evaluate, n, args.seconds)
    r = evaluate(episodes)
    steps = max(1, r.env_steps // n)
    bare = make_bare(module, n, steps).lower(params, key).compile()
    bare_kernels = count_kernels(bare.as_text())
    (total, ends), _ = timed(lambda: bare(params, key))
    total, ends = float(total), int(ends)
    bare_mean = total / max(ends, 1)
    if regime == "balancing":
        ok = bool(np.all(r.returns == 500.0)) and ends > 0 and bare_mean == 500.0
        check = (
            f"every jaxmesh return == 500: {bool(np.all(r.returns == 500.0))}; "
            f"bare reward sum / ends == 500: {bare_mean:.6g}"
        )
    else:
        mean = float(np.mean(r.returns))
        ok = ends > 0 and abs(mean - bare_mean) <= 0.05 * bare_mean
        check = (
            f"mean return: jaxmesh {mean:.4g} ({len(r.returns):,} episodes), bare scan "
            f"reward sum / ends {bare_mean:.4g} ({ends:,} ends): within 5%"
        )

    def run_jaxmesh():
        t0 = time.perf_counter()
        res = evaluate(episodes)
        wall = time.perf_counter() - t0
        return {
            "sps": res.steps_per_second,
            "sps_wall": res.env_steps / wall,
            "steps": res.env_steps,
        }

    def run_bare():
        _, dt = timed(lambda: bare(params, key))
        return {"sps": n * steps / dt}

    med = interleave({"jaxmesh": run_jaxmesh, "bare": run_bare}, args.repeats)
    return {
        "workload": f"gymnax CartPole-v1, mlp 2x64 {regime}",
        "N": n,
        "episodes": episodes,
        "mean len": float(np.mean(r.lengths)),
        "env steps": int(med["jaxmesh"]["steps"]),
        "bare env steps": n * steps,
        "jaxmesh sps": med["jaxmesh"]["sps"],
        "jaxmesh sps wall": med["jaxmesh"]["sps_wall"],
        "bare sps": med["bare"]["sps"],
        "first": mesh_first,
        "compile_time": first.compile_time,
        "bare first": bare_first,
        "first note": "bare 500 steps, jaxmesh 1 episode per lane",
        "kernels": jaxmesh_kernels(),
        "bare kernels": bare_kernels,
        "check": check,
        "check ok": ok,
    }


def playground(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from common import interleave, timed
    from playground import NAME, policy

    import jaxmesh
    from jaxmesh.envs import make_env

    n, length, k = args.num_envs, args.length, args.episodes_per_lane
    env = make_env(f"playground:{NAME}", config_overrides={"episode_length": length})
    raw = env.env
    reset, step = jax.vmap(raw.reset), jax.vmap(raw.step)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(k * n)).reshape(k, n, -1)

    def run(keys):  # [k, N] reset keys -> [k, N] returns
        def episode(_, ks):
            def body(c, _):
                state, ret, alive = c
                state = step(state, policy(state.obs))
                ret = ret + jnp.where(alive, state.reward, 0.0)
                return (state, ret, alive & ~(state.done > 0.5)), None

            init = (reset(ks), jnp.zeros(n), jnp.ones(n, bool))
            return None, jax.lax.scan(body, init, None, length)[0][1]

        return jax.lax.scan(episode, None, keys)[1]

    jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # the backend is up
    seeds = range(k * n)
    t0 = time.perf_counter()
    bare = jax.jit(run).lower(keys).compile()
    ref = np.asarray(bare(keys)).reshape(-1)
    bare_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = jaxmesh.evaluate(policy, env, num_envs=n, seeds=seeds)
    mesh_first = time.perf_counter() - t0
    try:
        np.testing.assert_allclose(first.returns, ref, rtol=1e-4, atol=1e-3)
        ok, why = True, "equal"
    except AssertionError as e:
        ok, why = False, str(e).strip().splitlines()[-1]
    check = f"all {k * n:,} per-episode returns equal the bare scan's: {why}"

    def run_jaxmesh():
        t0 = time.perf_counter()
        res = jaxmesh.evaluate(policy, env, num_envs=n, seeds=seeds)
        wall = time.perf_counter() - t0
        return {
            "sps": res.steps_per_second,
            "sps_wall": res.env_steps / wall,
            "steps": res.env_steps,
        }

    def run_bare():
        _, dt = timed(lambda: bare(keys))
        return {"sps": k * n * length / dt}

    med = interleave({"jaxmesh": run_jaxmesh, "bare": run_bare}, args.repeats)
    return {
        "workload": f"Playground {NAME} (MJX), tanh linear, length {length}",
        "N": n,
        "episodes": k * n,
        "mean len": float(np.mean(first.lengths)),
        "env steps": int(med["jaxmesh"]["steps"]),
        "bare env steps": k * n * length,
        "jaxmesh sps": med["jaxmesh"]["sps"],
        "jaxmesh sps wall": med["jaxmesh"]["sps_wall"],
        "bare sps": med["bare"]["sps"],
        "first": mesh_first,
        "compile_time": first.compile_time,
        "bare first": bare_first,
        "first note": "both: the whole budget",
        "kernels": jaxmesh_kernels(),
        "bare kernels": count_kernels(bare.as_text()),
        "check": check,
        "check ok": ok,
    }


def child(args) -> dict:
    t0 = time.perf_counter()
    if args.part == "playground":
        row = playground(args)
    else:
        row = cartpole(args, args.part.split("-", 1)[1])
    row["part"] = args.part
    row["part s"] = time.perf_counter() - t0
    row["info"] = device_info()
    return row


def spawn(args, part: str, limit: float) -> dict:
    """One workload in a fresh interpreter (no persistent compilation cache),
    killed after ``limit`` seconds."""
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p
    )
    cmd = [sys.executable, os.path.abspath(__file__), "--part", part]
    cmd += ["--num-envs", str(args.num_envs), "--seconds", str(args.seconds)]
    cmd += ["--repeats", str(args.repeats), "--length", str(args.length)]
    cmd += ["--episodes-per-lane", str(args.episodes_per_lane)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=limit
        )
    except subprocess.TimeoutExpired:
        return {"part": part, "error": f"killed at its time limit ({limit:.0f} s)"}
    wall = time.perf_counter() - t0
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        return {"part": part, "error": f"exit {out.returncode}:\n{tail}"}
    row = json.loads(lines[-1])
    row["process s"] = wall
    return row


# The report ------------------------------------------------------------------------
def report(args, rows: list[dict], info: dict | None, total_s: float) -> None:
    from common import goal, header, table

    settings = {
        "N": args.num_envs,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "playground length": args.length,
        "episodes per lane": args.episodes_per_lane,
        "time limit s": args.time_limit,
    }
    print(header("device: jaxmesh.evaluate vs a bare lax.scan", settings))
    for k, v in (info or {"devices": "no child reported them"}).items():
        print(f"- {k}: {v}")
    done = [r for r in rows if "error" not in r and "skipped" not in r]
    for r in rows:
        if "skipped" in r:
            print(f"\n{r['part']}: skipped: {r['skipped']}")
        elif "error" in r:
            print(f"\n{r['part']}: FAILED: {r['error']}")
    if done:
        print("\n### env steps/s (warm calls, medians of interleaved repeats)\n")
        print(
            table(
                ["workload", "N", "episodes", "mean len", "env steps"]
                + ["jaxmesh steps/s", "jaxmesh steps/s (wall)", "bare scan steps/s"]
                + ["ratio", "ratio (wall)"],
                [
                    [r["workload"], r["N"], r["episodes"], r["mean len"]]
                    + [r["env steps"], r["jaxmesh sps"], r["jaxmesh sps wall"]]
                    + [r["bare sps"], r["jaxmesh sps"] / r["bare sps"]]
                    + [r["jaxmesh sps wall"] / r["bare sps"]]
                    for r in done
                ],
            )
        )
        print("\n### first call (wall clock, compile included; fresh process)\n")
        print(
            table(
                ["workload", "jaxmesh first call s", "result.compile_time s"]
                + ["bare scan first call s", "jaxmesh / bare", "work"],
                [
                    [r["workload"], r["first"], r["compile_time"], r["bare first"]]
                    + [r["first"] / r["bare first"], r["first note"]]
                    for r in done
                ],
            )
        )
        print("\n### kernels in the compiled program (optimized HLO)\n")
        krows = []
        for r in done:
            for who, k in (
                ("jaxmesh segment", r["kernels"]),
                ("bare scan", r["bare kernels"]),
            ):
                if "error" in k:
                    krows.append([r["workload"], who, k["error"], "", "", "", ""])
                else:
                    krows.append(
                        [r["workload"], who, k["kernels"], k["fusion"]]
                        + [k["custom-call"], k["while"], k["conditional"]]
                    )
        print(
            table(
                ["workload", "program", "kernels", "fusion", "custom-call"]
                + ["while", "conditional"],
                krows,
            )
        )
        print("\n### returns checked\n")
        for r in done:
            ok = "ok" if r["check ok"] else "FAILED"
            print(f"- {r['workload']}: {ok}: {r['check']}")
    print(
        "\nratio = jaxmesh result.steps_per_second / bare scan steps/s; ratio (wall)"
        " uses the whole evaluate call's wall clock. Same env steps on both sides."
        f"\nTotal {total_s:.0f} s.\n"
    )
    backend = (info or {}).get("backend", "?")
    for r in done:
        for label, sps in (("", r["jaxmesh sps"]), (" (wall)", r["jaxmesh sps wall"])):
            ratio = sps / r["bare sps"]
            text = (
                f"evaluate >= 0.95x a bare scan{label} [{r['workload']}, "
                f"N={r['N']}, {backend}]"
            )
            print(goal(text, ratio, ratio >= 0.95))
    for r in rows:
        if "error" in r:
            print(f"goal: evaluate >= 0.95x a bare scan [{r['part']}]: not measured")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs", type=int, default=4096, help="lanes N")
    ap.add_argument(
        "--seconds", type=float, default=1.0, help="target CartPole jaxmesh run"
    )
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats")
    ap.add_argument("--length", type=int, default=1000, help="Playground episode")
    ap.add_argument(
        "--episodes-per-lane", type=int, default=2, help="Playground episodes a lane"
    )
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated")
    ap.add_argument(
        "--part-seconds",
        type=float,
        default=None,
        help="time limit per workload (default: 75 s per CartPole, 150 s Playground)",
    )
    ap.add_argument(
        "--time-limit", type=float, default=290.0, help="time limit for everything"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small sizes (N=256, Playground length 200): about 1 min on 2 CPUs",
    )
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part is not None:
        print(json.dumps(child(args)))
        return 0
    if args.quick:
        args.num_envs, args.seconds, args.repeats, args.length = 256, 0.3, 2, 200
    t_start = time.perf_counter()
    rows, info = [], None
    for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
        if part not in PARTS:
            ap.error(f"--parts: {part!r} is not one of {', '.join(PARTS)}")
        left = args.time_limit - (time.perf_counter() - t_start)
        if (
            part == "playground"
            and importlib.util.find_spec("mujoco_playground") is None
        ):
            rows.append(
                {"part": part, "skipped": "mujoco_playground is not importable"}
            )
            print(f"{part}: skipped (mujoco_playground is not importable)", flush=True)
            continue
        if left < 20:
            rows.append({"part": part, "skipped": f"{left:.0f} s left of --time-limit"})
            continue
        default = 150.0 if part == "playground" else 75.0
        limit = min(args.part_seconds or default, left)
        row = spawn(args, part, limit)
        rows.append(row)
        info = info or row.get("info")
        status = row.get("error", "").splitlines()[:1] or [
            f"{row.get('part s', 0):.0f} s"
        ]
        print(f"{part}: {status[0]}", flush=True)
    report(args, rows, info, time.perf_counter() - t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
