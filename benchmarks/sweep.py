"""A 4 x 2 delay x horizon sweep in one program against eight separate runs.

``jaxmesh.sweep(model, env, delay=[0, 1, 2, 3], horizon=[4, 8])`` scores the
eight cells in one compiled program (each cell's (h, d) is data its lanes read);
the alternative is eight ``jaxmesh.evaluate`` calls, each compiling its own
program (a fresh policy object per call, so no cache helps). Both score the
same episodes per cell with the same 2x256 relu MLP returning chunks of 12
Pendulum actions; the cells' returns are checked equal. Wall time, compile
included, one run of each in one process.

``--host`` runs the same comparison on gymnasium's Pendulum stepped in this
process: the sweep is one host run over the eight cells' episodes with one
compiled agent step; each separate call compiles its own. The env steps are
the same in both, so the sweep saves the compiles.

Goal: sweep / separate < 1.

Run: ``python benchmarks/sweep.py [--quick] [--host]``
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp
import numpy as np
from common import goal, header, init_mlp, machine, table

import jaxmesh

ENV = "gymnax:Pendulum-v1"
HOST_ENV = "gymnasium:Pendulum-v1"
K = 12
DELAYS, HORIZONS = [0, 1, 2, 3], [4, 8]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--num-envs", type=int, default=None)
    parser.add_argument(
        "--host", action="store_true", help="gymnasium Pendulum in this process"
    )
    args = parser.parse_args()
    env = HOST_ENV if args.host else ENV
    n = args.num_envs or (16 if args.host else 64)
    episodes = n if args.quick else 2 * n
    module, params = init_mlp((256, 256), K, obs_dim=3)

    def chunk(p, obs):
        return 2.0 * jnp.tanh(module.apply(p, obs))[:, None]

    def model():
        return jaxmesh.Model(chunk, params=params, name="mlp2x256_chunk12")

    kw = {"num_envs": n, "episodes": episodes, "layout": jaxmesh.Layout(plan_tile=32)}
    t0 = time.perf_counter()
    grid = jaxmesh.sweep(model(), env, delay=DELAYS, horizon=HORIZONS, **kw)
    sweep_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    compile_s = 0.0
    for d in DELAYS:
        for h in HORIZONS:
            delay = jaxmesh.Chunking(delay=d)
            alone = jaxmesh.evaluate(model(), env, horizon=h, chunking=delay, **kw)
            compile_s += alone.compile_time
            same = np.array_equal(alone.returns, grid.get(delay=d, horizon=h).returns)
            assert same, f"cell delay={d}, horizon={h} differs from its evaluate"
    separate_s = time.perf_counter() - t0

    ratio = sweep_s / separate_s
    cells = len(DELAYS) * len(HORIZONS)
    print(header("sweep", {"env": env, "num_envs": n, "episodes per cell": episodes}))
    print(machine())
    rows = [
        [f"sweep ({grid.programs} program)", sweep_s, grid.compile_time],
        [f"{cells} x evaluate ({cells} programs)", separate_s, compile_s],
    ]
    print(table(["run", "wall s", "compile s"], rows))
    print(goal("4 x 2 sweep / 8 separate evaluate calls (wall) < 1", ratio, ratio < 1))


if __name__ == "__main__":
    main()
