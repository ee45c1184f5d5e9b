"""Lanes sharded over devices: steps/s per device, idle share, and the cost of
the alternative (a global slot counter, one collective per step).

Measured side by side in one process on every device count from 1 to D (D: the
devices JAX sees; on a CPU-only machine the script asks XLA for 2 devices,
``--devices`` for more), with a float MLP on gymnax Acrobot (uneven episode
lengths):

1. **Scaling.** env steps/s of ``evaluate(..., layout=Layout(devices=d))`` (N
   lanes in all, N / d per device), compiled and warmed first, medians of
   interleaved repeats.
2. **Idle share of the static split.** Device d's lanes are busy for the sum of
   the lengths of the episodes they ran; the run lasts as long as its busiest
   lane. ``idle = 1 - busy / (lanes * steps of the run)``, per device, from the
   run's own ``lanes`` and ``lengths``. The global slot counter's schedule is
   exactly the one-device run's (lane j takes the next episode, whatever device
   holds it), so its steps come from that run the same way.
3. **The collective a global counter needs.** A ``shard_map`` while loop of
   1,000 steps with and without a ``jax.lax.all_gather`` of one int per step:
   the per-step price of keeping one counter across devices.

Run: ``python benchmarks/scale.py [--devices 2] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__" and "XLA_FLAGS" not in os.environ:
    n = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv else "2"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

import jaxmesh  # noqa: E402


def mlp(key, n_in=6, n_out=3, width=64):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (n_in, width)) * 0.5,
        "w2": jax.random.normal(k2, (width, n_out)) * 0.5,
    }


def policy(p, obs):
    logits = jnp.tanh(obs @ p["w1"]) @ p["w2"] * 0.3
    return jnp.argmax(logits + obs[5] * jnp.array([-2.0, 0.0, 2.0])).astype(jnp.int32)


def busy_steps(result, lanes: int, groups: int) -> tuple[np.ndarray, int]:
    """Per group of ``lanes`` lanes: summed episode lengths; and the run's steps
    (the busiest lane's summed lengths)."""
    per_lane = np.zeros(lanes * groups, np.int64)
    np.add.at(per_lane, result.lanes, result.lengths)
    return per_lane.reshape(groups, lanes).sum(1), int(per_lane.max())


def collective_cost(devices: int, steps: int = 1000) -> tuple[float, float]:
    """Seconds per while-loop step without and with one all_gather per step."""
    mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))
    spec = PartitionSpec("x")

    def make(gather: bool):
        def local(x):
            def body(c):
                i, v = c
                v = v * 1.0001 + 1.0
                if gather:
                    v = v + jnp.sum(jax.lax.all_gather(v[:1], "x")) * 0.0
                return i + 1, v

            return jax.lax.while_loop(lambda c: c[0] < steps, body, (0, x))[1]

        f = jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec)
        return jax.jit(f)

    x = jnp.zeros((devices * 256,))
    out = []
    for gather in (False, True):
        f = make(gather)
        f(x).block_until_ready()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            f(x).block_until_ready()
            times.append(time.perf_counter() - t)
        out.append(float(np.median(times)) / steps)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    counts = [d for d in (1, 2, 4, 8, 16) if d <= jax.device_count()]
    n, episodes, repeats = (64, 256, 2) if args.quick else (256, 2048, 3)
    params = mlp(jax.random.PRNGKey(0))
    print(
        f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} "
        f"devices, {os.cpu_count()} cores; Acrobot, float MLP, N = {n}, "
        f"E = {episodes}"
    )
    kw = dict(params=params, num_envs=n, episodes=episodes)
    results = {}
    for d in counts:  # compile and warm every contender first
        layout = jaxmesh.Layout(devices=d)
        results[d] = jaxmesh.evaluate(policy, "gymnax:Acrobot-v1", layout=layout, **kw)
    rates: dict[int, list[float]] = {d: [] for d in counts}
    for _ in range(repeats):  # interleaved
        for d in counts:
            layout = jaxmesh.Layout(devices=d)
            r = jaxmesh.evaluate(policy, "gymnax:Acrobot-v1", layout=layout, **kw)
            assert r.compile_time == 0.0
            rates[d].append(r.steps_per_second)
    one = results[1]
    _, global_steps = busy_steps(one, n, 1)
    print(
        "\n| devices | env steps/s | per device | vs 1 device | run steps "
        "(static) | run steps (global counter) | idle share per device |"
    )
    print("|---|---|---|---|---|---|---|")
    base = float(np.median(rates[1]))
    for d in counts:
        r = results[d]
        assert np.array_equal(r.returns, one.returns)
        busy, steps = busy_steps(r, n // d, d)
        idle = 1 - busy / ((n // d) * steps)
        rate = float(np.median(rates[d]))
        print(
            f"| {d} | {rate:,.0f} | {rate / d:,.0f} | {rate / base:.2f}x | "
            f"{steps} | {global_steps} | "
            f"{', '.join(f'{x:.1%}' for x in idle)} |"
        )
    if len(counts) > 1:
        plain, gathered = collective_cost(counts[-1])
        print(
            f"\nwhile-loop step on {counts[-1]} devices: {plain * 1e6:.2f} us; "
            f"with one all_gather per step: {gathered * 1e6:.2f} us "
            f"(+{(gathered - plain) * 1e6:.2f} us per step)"
        )
        per_step = 1 / (float(np.median(rates[counts[-1]])) / n)
        print(f"an engine step of N = {n} lanes here: {per_step * 1e6:,.0f} us")


if __name__ == "__main__":
    main()
