"""Temporal ensembling at K = 8 against the plain horizon-1 run of the same policy.

Both runs plan a chunk of 8 Pendulum actions every step with the same 2x256
relu MLP (a tanh output); the plain run executes chunk[0], the ensembled one
(``Chunking(execution=jaxmesh.Ensemble(m=0.01))``) keeps each lane's last 8 chunks in a
ring on the device and executes their weighted average. The extra work is one
ring write and one weighted sum per lane and step. Runs are interleaved in one
process; medians of the run time (compile excluded).

Goal: ensembled / plain <= 1.3.

Run: ``python benchmarks/ensemble.py [--quick]``
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
from common import goal, header, init_mlp, interleave, machine, table

import jaxmesh

ENV = "gymnax:Pendulum-v1"
K = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--num-envs", type=int, default=64)
    args = parser.parse_args()
    n = args.num_envs
    episodes = n if args.quick else 2 * n
    repeats = 3 if args.quick else 5
    module, params = init_mlp((256, 256), K, obs_dim=3)

    def chunk(p, obs):
        return 2.0 * jnp.tanh(module.apply(p, obs))[:, None]

    model = jaxmesh.Model(chunk, params=params, native_chunk=K, name="mlp2x256_chunk8")
    evaluators = {
        "plain h=1": jaxmesh.Evaluator(model, ENV, num_envs=n),
        "ensemble K=8": jaxmesh.Evaluator(
            model,
            ENV,
            num_envs=n,
            chunking=jaxmesh.Chunking(execution=jaxmesh.Ensemble(m=0.01)),
        ),
    }

    def contender(ev):
        def one():
            r = ev.run(episodes=episodes)
            return {"run_s": r.run_time, "steps_per_s": r.steps_per_second}

        return one

    med = interleave({k: contender(ev) for k, ev in evaluators.items()}, repeats)
    ratio = med["ensemble K=8"]["run_s"] / med["plain h=1"]["run_s"]
    print(header("ensemble", {"env": ENV, "num_envs": n, "episodes": episodes}))
    print(machine())
    rows = [[k, v["run_s"], v["steps_per_s"]] for k, v in med.items()]
    print(table(["run", "run s", "steps/s"], rows))
    print(goal("ensembling at K=8 / plain h=1 run time <= 1.3", ratio, ratio <= 1.3))


if __name__ == "__main__":
    main()
