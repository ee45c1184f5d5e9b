"""A suite of three same-shaped JAX tasks against the three runs one after another.

The tasks are gymnax CartPole with three pole lengths (env params); the policy
is the 2x64 MLP of ``common.balancing_params``. Side by side, interleaved, each
from a cold start (a new policy object, so no compiled program is reused):

- ``suite``: ``jaxmesh.evaluate(policy, jaxmesh.Suite(tasks, episodes=E))``,
  the tasks in one compiled program with the task as data;
- ``separate``: ``jaxmesh.evaluate(policy, task_env, episodes=E)`` for each task,
  one after another (three programs).

Each figure is the median wall time of the whole call, compiles included, over
repeats; the goal is ``separate / suite >= 1`` (the suite no slower). It also
checks that the suite compiled one run program and that every task's returns
equal its separate run's.

Run: ``python benchmarks/suite.py [--quick]``
"""

from __future__ import annotations

import argparse
import time

import gymnax
import jax
import numpy as np
from common import balancing_params, goal, header, init_mlp, interleave, table

import jaxmesh

LENGTHS = (0.4, 0.5, 0.6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    episodes, lanes, repeats = (64, 16, 2) if args.quick else (256, 64, 3)
    env, base = gymnax.make("CartPole-v1")
    tasks = {f"length {x}": (env, base.replace(length=x)) for x in LENGTHS}
    module, params = init_mlp((64, 64), 2)
    params = balancing_params(params)

    def policy():  # a new object each time: nothing compiled is reused
        return lambda obs: module.apply(params, obs).argmax()

    programs: list[int] = []

    def on_event(event: str, seconds: float, **kw) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            if "segment" in str(kw.get("fun_name", "")):
                programs[-1] += 1

    jax.monitoring.register_event_duration_secs_listener(on_event)
    results: dict[str, dict] = {}

    def suite() -> dict[str, float]:
        programs.append(0)
        t0 = time.perf_counter()
        r = jaxmesh.evaluate(
            policy(), jaxmesh.Suite(tasks, episodes=episodes), num_envs=lanes
        )
        results["suite"] = {n: x.returns for n, x in r.tasks.items()}
        return {"wall": time.perf_counter() - t0, "programs": programs[-1]}

    def separate() -> dict[str, float]:
        programs.append(0)
        t0 = time.perf_counter()
        out = {}
        for name, task in tasks.items():
            r = jaxmesh.evaluate(policy(), task, episodes=episodes, num_envs=lanes)
            out[name] = r.returns
        results["separate"] = out
        return {"wall": time.perf_counter() - t0, "programs": programs[-1]}

    med = interleave({"suite": suite, "separate": separate}, repeats)
    for name in tasks:
        np.testing.assert_array_equal(results["suite"][name], results["separate"][name])
    print(
        header(
            "Suite of same-shaped JAX tasks",
            {
                "tasks": len(tasks),
                "episodes per task": episodes,
                "lanes": lanes,
                "repeats": repeats,
            },
        )
    )
    print(
        table(
            ["run", "wall s (compile included)", "run programs compiled"],
            [
                ["suite (one program)", med["suite"]["wall"], med["suite"]["programs"]],
                ["three runs", med["separate"]["wall"], med["separate"]["programs"]],
            ],
        )
    )
    ratio = med["separate"]["wall"] / med["suite"]["wall"]
    print("\nreturns: every task equal to its separate run")
    print(goal("three separate runs / suite, wall time (>= 1)", ratio, ratio >= 1.0))


if __name__ == "__main__":
    main()
