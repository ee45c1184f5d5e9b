"""Lanes sharded over devices: ``evaluate(..., devices=...)`` and populations.

A static split, with no collective inside the loop (docs/scale.md says why):
device d of D runs every D-th episode of the budget (episodes d, d + D, ...)
on N / D lanes of its own, with the same engine, the same plan tile (the one a
one-device run with N lanes uses) and a slot counter of its own. Each episode
is reset with its own seed and planned in tiles of the same size, so its result
is bit for bit the one it has on one device (CONTRACT 3-4); only the lane that
ran it differs.

The D engines are one program: ``jax.shard_map`` over a one-axis mesh runs the
engine's own ``run_segment`` on each device's slice of a carry stacked along a
leading device axis. The carry is handled as a pytree (``jax.tree.map``), never
field by field, so lane state added to the engine needs nothing here. After a
segment the host merges the per-device results into one ``Results`` in episode
order (``merge_results``), which the single-device driver reports as it is.

Under ``jax.distributed`` the mesh may span several processes (docs/scale.md,
"Many hosts"): every process runs the same calls, builds the first carry of its
own devices only, places it (``jax.make_array_from_single_device_arrays``) and
reads the whole result back with one all-gather per visit (``to_host``), so
every process returns the same ``RunResult``.
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxmesh.core.results import Results, capacity_for, pow2_at_least
from jaxmesh.devices import check_local_share, host_device, mesh_size, resolve_mesh
from jaxmesh.run import build
from jaxmesh.run.scan import Evaluator, _Program, compiler_options


def split_lanes(num_envs: int, devices: int) -> int:
    """Lanes per device: ``num_envs / devices``.

    Raises:
      ValueError: ``num_envs`` is not a multiple of ``devices`` (every device
        runs the same program, so each holds the same number of lanes).
    """
    if num_envs % devices:
        below = max(devices, num_envs // devices * devices)
        above = -(-num_envs // devices) * devices
        raise ValueError(
            f"num_envs={num_envs} does not split evenly over {devices} devices; "
            f"every device runs the same program on the same number of lanes. "
            f"Pass a multiple of {devices} (e.g. {below} or {above})"
        )
    return num_envs // devices


def device_capacity(episodes: int, devices: int, lanes: int) -> int:
    """Result-buffer capacity per device for a budget split over ``devices``.

    ``capacity_for`` of the largest share, raised above ``lanes`` when needed, so
    that a per-episode buffer never has a per-lane buffer's length (the merge
    tells them apart by shape) and the engine never clamps its lanes.
    """
    share = -(-episodes // devices)
    return max(capacity_for(share), pow2_at_least(lanes + 1))


def device_seeds(seeds: np.ndarray, devices: int) -> list[np.ndarray]:
    """Device d's share of the budget: episodes d, d + D, d + 2D, ..."""
    return [seeds[d::devices] for d in range(devices)]


def put(tree: Any, sharding: NamedSharding) -> Any:
    """A host (or device) pytree as global arrays with ``sharding``.

    In one process ``jax.device_put`` does it; under ``jax.distributed`` every
    process holds the same host values and places only its own devices' slices.

    Args:
      tree: host or local device arrays, the same values in every process.
      sharding: where the global arrays live.
    """
    if not sharding.mesh.is_multi_process:
        return jax.device_put(tree, sharding)

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda i: x[i])

    return jax.tree.map(one, tree)


def _identity(tree: Any) -> Any:
    return tree


@functools.lru_cache(maxsize=8)
def _gather(mesh: Mesh) -> Any:
    """A jitted identity whose outputs are whole on every device of ``mesh``."""
    return jax.jit(_identity, out_shardings=NamedSharding(mesh, PartitionSpec()))


def to_host(tree: Any, mesh: Mesh) -> Any:
    """Arrays sharded over ``mesh``, read back whole as numpy.

    Over several processes one program gathers every leaf (an all-gather over
    the processes' collectives: gloo on CPUs, NCCL on GPUs, ICI on TPUs) and each
    process reads its own copy, so every process gets all of it. Every process
    of the mesh must make the same call.

    Args:
      tree: a pytree of ``jax.Array`` laid out over ``mesh``.
      mesh: the run's mesh.

    Returns:
      The same pytree of numpy arrays, whole.
    """
    if not mesh.is_multi_process:
        return jax.device_get(tree)
    whole = _gather(mesh)(tree)
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), whole)


def fingerprint(seeds: np.ndarray, params: Any) -> np.ndarray:
    """``[episodes, crc32 of the seeds, crc32 of the params' values]`` (uint32).

    What every process of a run must agree on; reading the params to the host
    costs one copy of them per run.
    """
    p = 0
    for leaf in jax.tree.leaves(params):
        p = zlib.crc32(np.ascontiguousarray(np.asarray(leaf)).tobytes(), p)
    s = zlib.crc32(np.ascontiguousarray(seeds, np.int64).tobytes())
    return np.array([seeds.size, s, p], np.uint32)


def merge_results(stacked: Results, capacity: int, lanes: int) -> Results:
    """Per-device results (leading axis D) as one ``Results`` in episode order.

    Device d's entry k is episode ``k * D + d``. Each leaf is read by shape:
    ``[D, capacity, ...]`` per episode (interleaved into ``capacity * D``
    entries), ``[D, lanes, ...]`` per lane (concatenated: device d's lane j is
    lane ``d * lanes + j``), ``[D]`` a run total (summed). The two fields that
    hold indices are renumbered: ``lanes`` (per episode) and ``fault.episode``.

    Args:
      stacked: host ``Results`` whose leaves carry a leading device axis.
      capacity: entries per device (``device_capacity``; never equal to lanes).
      lanes: lanes per device.
    """
    d = np.asarray(stacked.done).shape[0]
    col = np.arange(d)[:, None]
    stacked = stacked.replace(
        lanes=np.asarray(stacked.lanes) + col * lanes,
        fault=stacked.fault.replace(
            episode=np.asarray(stacked.fault.episode) * d + col
        ),
    )

    def one(x):
        x = np.asarray(x)
        if x.ndim == 1:
            return x.sum(dtype=np.int64 if x.dtype.kind in "iub" else None)
        if x.shape[1] == capacity:
            return np.swapaxes(x, 0, 1).reshape((capacity * d,) + x.shape[2:])
        if x.shape[1] == lanes:
            return x.reshape((d * lanes,) + x.shape[2:])
        raise ValueError(
            f"a results leaf of shape {x.shape} is neither per episode "
            f"({capacity}) nor per lane ({lanes}) on each of {d} devices"
        )

    return jax.tree.map(one, stacked)


def _segment(engine: Any, mesh: Mesh, steps: int) -> Any:
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


class ShardedEvaluator(Evaluator):
    """An ``Evaluator`` whose lanes are split over the devices of a mesh.

    Built by ``jaxmesh.Evaluator(..., devices=...)`` (and ``evaluate``); see
    ``Evaluator`` for the other arguments. ``num_envs`` must be a multiple of
    the number of devices D; each device runs ``num_envs / D`` lanes and every
    D-th episode. Results equal a one-device run's episode for episode (the
    ``lanes`` field aside); ``plan_tile`` defaults to the one-device run's.

    Under ``jax.distributed`` every process builds the same evaluator and
    makes the same calls; each drives its own devices of the mesh and returns
    the whole result (docs/scale.md, "Many hosts").

    Raises:
      ValueError: ``num_envs`` not a multiple of D, a policy pinned to one
        device (``jaxmesh.Model(device=...)``), or a mesh with no device of this
        process.
    """

    #: ``on_step`` hooks are refused (a ``ValueError`` before anything
    #: compiles): the step events would come from D programs at once, with no
    #: order between the devices' steps (docs/evaluation.md, "Step hooks").
    supports_step_hooks = False

    def __init__(self, policy: Any, env: Any, *, devices: Any, **settings: Any):
        super().__init__(policy, env, **settings)
        self.mesh = resolve_mesh(devices)
        self.num_devices = mesh_size(self.mesh)
        self.lanes_per_device = split_lanes(self.settings.num_envs, self.num_devices)
        if self.policy.device is not None:
            raise ValueError(
                f"policy {self.policy.name!r} is pinned to {self.policy.device}, "
                f"but devices= splits the run over {self.num_devices} devices; "
                "build the policy with device=None"
            )
        check_local_share(self.mesh)
        self._axis = self.mesh.axis_names[0]

    def _capacity(self, episodes: int) -> int:
        return device_capacity(episodes, self.num_devices, self.lanes_per_device)

    def _engine_settings(self, chunk: int | None) -> Any:
        """The one-device settings with N / D lanes and the N-lane plan tile."""
        s = self.settings
        h = min(s.horizon, chunk) if chunk is not None else 1
        tile = s.plan_tile or build.default_plan_tile(h, s.num_envs)
        return s._replace(num_envs=self.lanes_per_device, plan_tile=tile)

    def _compiled(self, params: Any, capacity: int) -> tuple[_Program, bool]:
        program = self._program(params, capacity)
        if program.segment is not None:
            return program, False
        d = self.num_devices
        split = NamedSharding(self.mesh, PartitionSpec(self._axis))
        whole = NamedSharding(self.mesh, PartitionSpec())
        stack = lambda s: jax.ShapeDtypeStruct((d,) + s.shape, s.dtype, sharding=split)
        shape = program.engine.carry_shape()
        segment = (
            _segment(program.engine, self.mesh, self.settings.segment_steps)
            .lower(
                jax.tree.map(
                    lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=whole),
                    build.abstract(params),
                ),
                jax.tree.map(stack, (shape.lanes, shape.agent)),
                jax.tree.map(stack, shape.results),
            )
            .compile(compiler_options(self.mesh.devices.flat[0]))
        )
        program = program._replace(segment=segment)
        self._programs[(build.signature(params), capacity)] = program
        return program, True

    def first_carry(self, program: _Program, seeds: np.ndarray) -> Any:
        """The first carry of every device, stacked along the mesh axis.

        Each process builds (on its host) and places only its own devices'
        carries: device d of the mesh gets the carry of its share of the budget
        (``device_seeds``); nothing compiles.
        """
        shares = device_seeds(seeds, self.num_devices)
        host = host_device()
        mine = [
            (dev, jax.device_get(program.engine.first_carry(shares[d], host)))
            for d, dev in enumerate(self.mesh.devices.flat)
            if dev.process_index == jax.process_index()
        ]
        split = NamedSharding(self.mesh, PartitionSpec(self._axis))

        def one(*leaves):
            shape = (self.num_devices,) + np.shape(leaves[0])
            placed = [
                jax.device_put(np.asarray(x)[None], dev)
                for (dev, _), x in zip(mine, leaves, strict=True)
            ]
            return jax.make_array_from_single_device_arrays(shape, split, placed)

        return jax.tree.map(one, *(carry for _, carry in mine))

    def check_same_everywhere(self, seeds: np.ndarray, params: Any) -> None:
        """Under ``jax.distributed``: checks that every process of the mesh was
        given the same budget and params (one small all-gather).

        Each process places only its own devices' share, so a process with other
        seeds or params would silently mix two runs into one result.

        Raises:
          ValueError: in every process, naming the processes that differ from
            the first one of the mesh and what differs.
        """
        if not self.mesh.is_multi_process:
            return
        mine = fingerprint(seeds, params)
        d = self.num_devices
        rows = np.broadcast_to(mine, (d, mine.size))
        split = NamedSharding(self.mesh, PartitionSpec(self._axis))
        rows = to_host(
            jax.make_array_from_callback(rows.shape, split, lambda i: rows[i]),
            self.mesh,
        )
        owners = [dev.process_index for dev in self.mesh.devices.flat]
        differ = sorted({owners[k] for k in range(d) if np.any(rows[k] != rows[0])})
        if differ:
            what = [
                name
                for name, col in (("episodes", 0), ("seeds", 1), ("params", 2))
                if np.any(rows[:, col] != rows[0, col])
            ]
            raise ValueError(
                f"under jax.distributed, process(es) {differ} were given other "
                f"{' and '.join(what)} than process {owners[0]}; every process "
                "must make the same call with the same seeds and params (build "
                "params from the same key in every process, or load the same "
                "checkpoint)"
            )

    def _loop(self, program: _Program, params, seeds_arr, episodes_out) -> Any:
        # The first collective of a run: nothing before it depends on the
        # values the processes might disagree on.
        self.check_same_everywhere(seeds_arr, params)
        carry = self.first_carry(program, seeds_arr)
        params = put(params, NamedSharding(self.mesh, PartitionSpec()))
        capacity = program.engine.config.capacity
        lanes = program.engine.config.agent.num_envs
        state, res = (carry.lanes, carry.agent), carry.results
        e = seeds_arr.size
        # Over several processes a failure must not read the device results:
        # that is a collective, and a process that failed alone would wait for
        # its peers forever. A failure there keeps the episodes of the last read
        # (every segment with hooks; the faulty one for a bad value).
        several = self.mesh.is_multi_process
        while True:
            state, res = program.segment(params, state, res)
            if not several:
                episodes_out.latest = _Merged(res, capacity, lanes)
            n_done, faults = to_host((state[0].n_done, res.fault.kind), self.mesh)
            finished = int(np.sum(n_done)) >= e
            # Every process reads the same values, so all take the same branch
            # (and make the same collectives).
            if episodes_out.wants_episodes or finished or np.any(faults):
                host = merge_results(to_host(res, self.mesh), capacity, lanes)
                episodes_out.update(host)
                episodes_out.check_fault(host)
                if finished:
                    return host


class _Merged:
    """Device results that read back merged (``EpisodeStream.partial`` calls
    ``jax.device_get`` on what it keeps; a pytree node does the merge)."""

    def __init__(self, res: Results, capacity: int, lanes: int):
        self.res, self.capacity, self.lanes = res, capacity, lanes


jax.tree_util.register_pytree_node(
    _Merged,
    lambda m: ((m.res,), (m.capacity, m.lanes)),
    lambda aux, kids: merge_results(jax.device_get(kids[0]), *aux),
)


def shard_population(evaluator: Any, devices: Any = "all") -> Any:
    """A ``make_evaluator`` function run over a population sharded over devices.

    Device d of D evaluates members ``d * P / D .. (d + 1) * P / D - 1`` of a
    population of P params (a leading axis on every leaf) with ``jax.vmap``
    over its own slice: no collective, and the same numbers as the unsharded
    ``jax.jit(jax.vmap(evaluator))``.

    Args:
      evaluator: a function returned by ``jaxmesh.make_evaluator``.
      devices: as for ``jaxmesh.evaluate`` (``"all"``, an int, devices, a mesh).

    Returns:
      A jitted ``run(population, seeds=None) -> Results`` whose leaves have a
      leading population axis P (P must be a multiple of D); ``seeds``, when
      given, are shared by every member.

    Raises:
      ValueError: P is not a multiple of D, or the leaves disagree on P.

    Example::

      run = jaxmesh.make_evaluator(apply, "gymnax:CartPole-v1", episodes=16)
      scores = jaxmesh.shard_population(run)(population).returns  # [P, 16]
    """
    mesh = resolve_mesh(devices, "shard_population: devices")
    d = mesh_size(mesh)
    spec = PartitionSpec(mesh.axis_names[0])

    def local(population, *seeds):
        return jax.vmap(evaluator, in_axes=(0,) + (None,) * len(seeds))(
            population, *seeds
        )

    fns: dict = {}

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
        if len(extra) not in fns:
            fns[len(extra)] = jax.jit(
                jax.shard_map(
                    local,
                    mesh=mesh,
                    in_specs=(spec,) + (PartitionSpec(),) * len(extra),
                    out_specs=spec,
                    check_vma=False,
                )
            )
        return fns[len(extra)](population, *extra)

    return run


__all__ = [
    "ShardedEvaluator",
    "shard_population",
    "merge_results",
    "split_lanes",
    "device_capacity",
    "device_seeds",
    "fingerprint",
    "put",
    "to_host",
]
