"""The default plan tile on few lanes, and what it costs in invariance.

Two measurements, side by side in one process:

1. **Rows across tile sizes.** The same 256 observations go through an MLP in
   batches of 1, 2, 4, ..., 256 rows (one jitted call per batch size); the table
   says, per tile size, whether every row is bit-identical to the 8-row tile's.
   A lane count that changes the default tile changes the rows' batch size, so
   this is exactly what lane-count invariance rests on when the tile follows N.
2. **Few lanes, heavy policy.** 4 and 8 lanes of a 3x512 MLP on CartPole (h = 1):
   env steps/s with the default tile against the old N-independent default
   (128 rows) and ``plan_tile=8``; policy rows per env step.

Run: ``python benchmarks/tiles.py [--quick]``
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from common import goal, header, init_mlp, interleave, machine, table

import jaxmesh
from jaxmesh.run.build import default_plan_tile

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NETS = {"2x64 (obs 6)": ((64, 64), 6), "3x512 (obs 4)": ((512, 512, 512), 4)}


def rows_identical() -> list[list]:
    out = []
    for name, (hidden, obs_dim) in NETS.items():
        module, params = init_mlp(hidden, 3, obs_dim=obs_dim)
        x = jax.random.normal(jax.random.PRNGKey(1), (256, obs_dim))
        f = jax.jit(module.apply)
        by_tile = {
            t: np.concatenate(
                [np.asarray(f(params, x[i : i + t])) for i in range(0, 256, t)]
            )
            for t in SIZES
        }
        out.append(
            [name]
            + ["=" if (by_tile[t] == by_tile[8]).all() else "differs" for t in SIZES]
        )
    return out


def few_lanes(repeats: int, episodes_per_lane: int) -> list[dict]:
    module, params = init_mlp((512, 512, 512), 2)

    def heavy(p, obs):
        return jnp.argmax(module.apply(p, obs)).astype(jnp.int32)

    rows = []
    for n in (4, 8):
        tiles = {"default": None, "old default (128)": 128, "plan_tile=8": 8}

        def runner(tile, n=n):
            def run():
                r = jaxmesh.evaluate(
                    heavy,
                    "gymnax:CartPole-v1",
                    params=params,
                    num_envs=n,
                    episodes=n * episodes_per_lane,
                    layout=jaxmesh.Layout(plan_tile=tile),
                )
                return {
                    "sps": r.steps_per_second,
                    "rows": r.rows_per_step,
                    "plan_tile": r.plan_tile,
                }

            return run

        res = interleave({k: runner(t) for k, t in tiles.items()}, repeats)
        for k, v in res.items():
            rows.append({"N": n, "setting": k, **v})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    print(
        header(
            "tiles: the default plan tile",
            {"jax": machine()["jax"], "cpus": machine()["nproc"]},
        )
    )
    print("\nRows bit-identical to the 8-row tile's (= same bits), per tile size:\n")
    print(table(["MLP"] + [str(t) for t in SIZES], rows_identical()))
    rows = few_lanes(1 if args.quick else 3, 2 if args.quick else 6)
    print("\nFew lanes, 3x512 MLP on CartPole, h = 1 (medians):\n")
    print(
        table(
            ["N", "setting", "rows per call", "rows / env step", "env steps/s"],
            [
                [r["N"], r["setting"], int(r["plan_tile"]), r["rows"], r["sps"]]
                for r in rows
            ],
        )
    )
    for n in (4, 8):
        by = {r["setting"]: r for r in rows if r["N"] == n}
        speed = by["default"]["sps"] / by["old default (128)"]["sps"]
        print(
            goal(f"default tile vs old default at N={n} (speed-up)", speed, speed >= 3)
        )
        print(f"result: default tile at N={n}, h=1: {default_plan_tile(1, n)} rows")


if __name__ == "__main__":
    main()
