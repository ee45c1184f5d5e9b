# ruff: noqa: E402 - OPENBLAS_NUM_THREADS must be set before numpy loads
"""jaxmesh against rlmesh (PyPI) running the same policy on gymnasium CartPole.

rlmesh comes from the ``[peer]`` extra (``pip install 'jaxmesh[peer]'``, which
``make bench`` runs); nothing is installed at run time. Without it the script
prints how to install it and exits 0, so ``run_all.py`` goes on. rlmesh is driven
through its public API only: a ``rlmesh.numpy.Model`` subclass with ``predict``
and ``predict_batch`` (the 2x64 MLP in numpy, same weights as jaxmesh's) and
``Model.run(env, episodes=E)`` on ``gymnasium.make_vec("CartPole-v1",
num_envs=N, vectorization_mode="sync")`` with NEXT_STEP autoreset (rlmesh
refuses SAME_STEP and DISABLED on a stock gymnasium vector env). Its figure is
``result.total_steps`` over the wall clock of ``run`` (which includes the
loopback server it starts; the budget is sized so that a run takes about
``--seconds``). jaxmesh runs ``evaluate`` on gymnax CartPole-v1 with the same N
and weights (``result.steps_per_second``, warm). Interleaved, medians.

Run: ``python benchmarks/rlmesh_peer.py [--quick]``
"""

from __future__ import annotations

import os

# Tiny numpy matmuls are fastest on one thread, and idle OpenBLAS threads spin
# on the cores the env loop needs (2.4 ms vs 58 us per 256-row forward here).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import math
import sys
import time
from importlib import metadata

#: The version the README's figures were measured with (pinned by ``[peer]``).
RLMESH_VERSION = "0.1.0"
INSTALL = "pip install 'jaxmesh[peer]'"


def import_rlmesh() -> tuple[object | None, str]:
    """Imports rlmesh and ``rlmesh.numpy`` from the running interpreter.

    Returns:
      (the module, a note naming its version), or (None, why it is missing and
      the command that installs it).
    """
    try:
        import rlmesh
        import rlmesh.numpy  # noqa: F401
    except ImportError as e:
        return None, (
            f"rlmesh is not importable from {sys.executable} ({e}); it is an "
            f"optional benchmark dependency: {INSTALL} (rlmesh=={RLMESH_VERSION}), "
            "or `make bench`, which installs it"
        )
    try:
        version = metadata.version("rlmesh")
    except metadata.PackageNotFoundError:
        version = getattr(rlmesh, "__version__", "unknown")
    note = f"rlmesh {version}"
    if version != RLMESH_VERSION:
        note += f" (the README's figures are for {RLMESH_VERSION})"
    return rlmesh, note


def main(argv: list[str] | None = None) -> list[list]:
    """Prints the rlmesh comparison table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs-list", default="16,256", help="comma-separated N")
    ap.add_argument("--seconds", type=float, default=1.5, help="target run length")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats, args.num_envs_list = 0.3, 1, "16"

    print("## rlmesh_peer: jaxmesh vs rlmesh on CartPole-v1\n")
    rlmesh, note = import_rlmesh()
    if rlmesh is None:
        print(f"rlmesh not measured: {note}")
        return []

    import gymnasium as gym
    import jax
    import jax.numpy as jnp
    from common import init_mlp, interleave, machine, size_budget, table
    from peer import numpy_mlp

    import jaxmesh

    module, params = init_mlp((64, 64), 2)
    forward = numpy_mlp(params)

    class MLP2x64(rlmesh.numpy.Model):
        workflow_edition = "2026.06"

        def predict(self, obs):
            return int(forward(obs[None])[0])

        def predict_batch(self, obs):
            return forward(obs).astype("int64")

    ns = [int(x) for x in args.num_envs_list.split(",")]
    print(
        "settings: "
        + ", ".join(
            f"{k}={v}"
            for k, v in {
                "N": ns,
                "policy": "mlp 2x64 (random init)",
                "run target s": args.seconds,
                "repeats": args.repeats,
                "rlmesh": note,
                "gymnasium": gym.__version__,
                "jax": jax.__version__,
                "cpus": machine()["nproc"],
            }.items()
        )
        + "\n"
    )

    def rl_run(n: int, episodes: int) -> dict:
        envs = gym.make_vec(
            "CartPole-v1",
            num_envs=n,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
        )
        model = MLP2x64()
        try:
            t0 = time.perf_counter()
            r = model.run(envs, episodes=episodes)
            dt = time.perf_counter() - t0
        finally:
            model.close()
            envs.close()
        return {"sps": r.total_steps / dt, "run_time": dt, "steps": r.total_steps}

    env = "gymnax:CartPole-v1"
    rows = []
    for n in ns:
        policy = jaxmesh.Model(
            lambda p, obs: jnp.argmax(module.apply(p, obs)).astype(jnp.int32),
            params=params,
            name="mlp2x64",
        )
        episodes = size_budget(
            lambda e, n=n, policy=policy: jaxmesh.evaluate(
                policy, env, num_envs=n, episodes=e
            ),
            n,
            args.seconds,
        )
        # rlmesh's run has fixed costs (a loopback server, the vector reset, the
        # tail of a lockstep vector): time a one-episode-per-lane run and a big
        # one, and report the big run's wall rate and the marginal rate.
        small = n
        t_small = rl_run(n, small)["run_time"]
        t_four = rl_run(n, 4 * small)["run_time"]
        # The larger of the two estimates, so that a noisy difference cannot
        # blow the budget up.
        per_ep = max(t_four / (4 * small), (t_four - t_small) / (3 * small))
        big = n * max(4, math.ceil(args.seconds / per_ep / n))

        def run_jaxmesh(n=n, policy=policy, episodes=episodes):
            r = jaxmesh.evaluate(policy, env, num_envs=n, episodes=episodes)
            return {"sps": r.steps_per_second, "run_time": r.run_time}

        med = interleave(
            {
                "jaxmesh": run_jaxmesh,
                "rl_small": lambda n=n, e=small: rl_run(n, e),
                "rl_big": lambda n=n, e=big: rl_run(n, e),
            },
            args.repeats,
        )
        jm, rs, rb = med["jaxmesh"], med["rl_small"], med["rl_big"]
        marginal = (rb["steps"] - rs["steps"]) / max(
            rb["run_time"] - rs["run_time"], 1e-9
        )
        rows.append(
            [n, "jaxmesh.evaluate (gymnax)", episodes, jm["run_time"], jm["sps"], 1.0]
        )
        label = "rlmesh Model.run (gymnasium sync vector), wall"
        rows.append([n, label, big, rb["run_time"], rb["sps"], jm["sps"] / rb["sps"]])
        label = f"rlmesh marginal ({big} - {small} episodes)"
        rows.append([n, label, big - small, rb["run_time"] - rs["run_time"],
                     marginal, jm["sps"] / marginal])  # fmt: skip
    print(
        table(
            ["N", "runner", "episodes", "run s", "env steps/s", "jaxmesh speed-up"],
            rows,
        )
    )
    print(
        "\nrlmesh wall: total_steps / wall clock of Model.run (loopback server "
        "included). marginal: extra steps / extra seconds of the big run over a "
        "one-episode-per-lane run (fixed costs excluded). Medians of interleaved "
        "repeats.\n"
    )
    for r in rows[2::3]:
        print(f"result: jaxmesh over rlmesh (marginal rate) at N={r[0]}: {r[5]:.3g}x")
    return rows


if __name__ == "__main__":
    main()
