"""Lanes sharded over devices (``Layout(devices=...)``) and populations: device d
of D runs episodes d, d + D, ... with no collective, so each is bit for bit the
one-device one (CONTRACT 3-4; docs/scale.md). The host merges the logs."""

from __future__ import annotations

import functools
import math
import zlib
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxmesh.core.tally import Results, per_episode, replace_per_episode
from jaxmesh.devices import mesh_size, resolve_mesh


def split_lanes(num_envs: int, devices: int) -> int:
    """Lanes per device (ValueError when ``devices`` does not divide them)."""
    if num_envs % devices:
        below = max(devices, num_envs // devices * devices)
        above = -(-num_envs // devices) * devices
        raise ValueError(
            f"num_envs={num_envs} does not split evenly over {devices} devices; "
            f"every device runs the same program on the same number of lanes. "
            f"Pass a multiple of {devices} (e.g. {below} or {above})"
        )
    return num_envs // devices


def device_seeds(seeds: np.ndarray | None, devices: int) -> list:
    """Device d's share of the budget: episodes d, d + D, d + 2D, ..."""
    return [None if seeds is None else seeds[d::devices] for d in range(devices)]


def put(tree: Any, sharding: NamedSharding) -> Any:
    """A pytree (the same in every process) as global arrays with ``sharding``."""
    if not sharding.mesh.is_multi_process:
        return jax.device_put(tree, sharding)

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda i: x[i])

    return jax.tree.map(one, tree)


@functools.lru_cache(maxsize=8)
def _gather(mesh: Mesh) -> Any:
    """A jitted identity whose outputs are whole on every device of ``mesh``."""
    return jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec()))


def to_host(tree: Any, mesh: Mesh) -> Any:
    """A pytree sharded over ``mesh`` read back whole (an all-gather)."""
    if not mesh.is_multi_process:
        return jax.device_get(tree)
    whole = _gather(mesh)(tree)
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), whole)


def merge_logs(stacked: Results, lanes: int) -> Results:
    """The devices' stacked logs as one: device d's episode k is ``k * D + d``."""
    rows = np.asarray(stacked.rows)
    d = rows.shape[0]
    col = np.arange(d)[:, None]
    fields = per_episode(stacked)
    fields["index"] = np.asarray(stacked.index) * d + col
    fields["lanes"] = np.asarray(stacked.lanes) + col * lanes
    merged = {
        k: np.concatenate([np.asarray(v)[k_, : rows[k_]] for k_ in range(d)])
        for k, v in fields.items()
    }
    fault = stacked.fault.replace(episode=np.asarray(stacked.fault.episode) * d + col)
    per_lane = lambda x: np.asarray(x).reshape((d * lanes,) + np.shape(x)[2:])
    total = lambda x: np.asarray(x).sum(dtype=np.int64)
    return replace_per_episode(stacked, merged).replace(
        rows=np.int64(rows.sum()),
        fault=jax.tree.map(per_lane, fault),
        env_steps=total(stacked.env_steps),
        policy_rows=total(stacked.policy_rows),
    )


def segment_program(engine: Any, mesh: Mesh, steps: int) -> Any:
    """The engine's ``run_segment`` on every device's slice of a stacked carry."""
    spec = PartitionSpec(mesh.axis_names[0])

    def local(params, state, res):
        own = lambda t: jax.tree.map(lambda x: x[0], t)
        state, res = engine.run_segment(params, own(state), own(res), steps)
        back = lambda t: jax.tree.map(lambda x: x[None], t)
        return back(state), back(res)

    # check_vma=False: each device's loop is its own (no collective inside), and
    # a carry leaf the engine builds from a constant must not need annotating.
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(PartitionSpec(), spec, spec),
        out_specs=(spec, spec),
        check_vma=False,
    )
    return jax.jit(sharded, donate_argnums=(1,))


def check_same_everywhere(mesh: Mesh, seeds: np.ndarray, params: Any) -> None:
    """Refuses processes given other budgets or params (``jax.distributed``)."""
    if not mesh.is_multi_process:
        return
    p = 0
    for leaf in jax.tree.leaves(params):
        p = zlib.crc32(np.ascontiguousarray(np.asarray(leaf)).tobytes(), p)
    s = zlib.crc32(np.ascontiguousarray(seeds, np.int64).tobytes())
    d = mesh_size(mesh)
    # Every process's [episodes, crc32 of the seeds, crc32 of the params].
    rows = np.broadcast_to(np.array([seeds.size, s, p], np.uint32), (d, 3))
    split = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    rows = to_host(put(rows, split), mesh)
    owners = [dev.process_index for dev in mesh.devices.flat]
    differ = sorted({owners[k] for k in range(d) if np.any(rows[k] != rows[0])})
    if differ:
        names = ("episodes", "seeds", "params")
        what = [n for c, n in enumerate(names) if np.any(rows[:, c] != rows[0, c])]
        raise ValueError(
            f"under jax.distributed, process(es) {differ} were given other "
            f"{' and '.join(what)} than process {owners[0]}; every process "
            "must make the same call with the same seeds and params (build "
            "params from the same key in every process, or load the same "
            "checkpoint)"
        )


def shard_population(evaluator: Any, devices: Any = "all") -> Any:
    """A ``make_evaluator`` function over a population sharded over devices:
    each device vmaps its slice of the members, with the numbers of
    ``jax.jit(jax.vmap(evaluator))``.

    Args:
      evaluator: a function returned by ``jaxmesh.make_evaluator``.
      devices: as for ``jaxmesh.evaluate`` (``"all"``, an int, devices, a mesh).

    Returns:
      A jitted ``run(population, seeds=None) -> Results`` over a leading
      population axis P on every leaf; ``seeds`` are shared by every member.

    Raises:
      ValueError: P is not a multiple of D, or the leaves disagree on P.

    Example::

      run = jaxmesh.make_evaluator(apply, "gymnax:CartPole-v1", episodes=16)
      scores = jaxmesh.shard_population(run)(population).returns  # [P, 16]
    """
    mesh = resolve_mesh(devices, "shard_population: devices")
    d = mesh_size(mesh)
    spec = PartitionSpec(mesh.axis_names[0])

    @functools.cache
    def program(n_seeds: int) -> Any:
        return jax.jit(
            jax.shard_map(
                jax.vmap(evaluator, in_axes=(0,) + (None,) * n_seeds),
                mesh=mesh,
                in_specs=(spec,) + (PartitionSpec(),) * n_seeds,
                out_specs=spec,
                check_vma=False,
            )
        )

    def run(population: Any, seeds: Any = None) -> Results:
        sizes = {
            np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(population)
        }
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                "shard_population: every params leaf needs the same leading "
                f"population axis; got leading sizes {sorted(map(str, sizes))}"
            )
        (p,) = sizes
        if p % d:
            raise ValueError(
                f"shard_population: a population of {p} does not split evenly over "
                f"{d} devices; pass a multiple of {d} members "
                f"(e.g. {math.ceil(p / d) * d})"
            )
        extra = () if seeds is None else (seeds,)
        return program(len(extra))(population, *extra)

    return run
