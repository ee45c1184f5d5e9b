"""Where an ``Evaluator``'s lanes run: ``SingleDevice`` or ``DeviceMesh`` (one
mesh axis, also under ``jax.distributed``)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxmesh.core.carry import refill, window, window_fits, with_window
from jaxmesh.core.tally import Results
from jaxmesh.devices import check_local_share, host_device, mesh_size, resolve_mesh
from jaxmesh.run import build
from jaxmesh.run.scan import sharded

#: XLA options for the segment on a CPU: LLVM's level 1 instead of 2 compiles
#: about a fifth faster and ran as fast (benchmarks/compile.py, overhead.py).
#: The fusion emitters stay on: off, they compiled 15-35% faster but ran
#: 1.3-1.7x slower on CartPole and Acrobot.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def compiler_options(device: Any = None) -> dict | None:
    platform = (device or jax.devices()[0]).platform
    return dict(CPU_COMPILER_OPTIONS) if platform == "cpu" else None


class SingleDevice:
    """Every lane on one device (None: JAX's default)."""

    #: One program sends the step events in order.
    supports_step_hooks = True

    def __init__(self, device: Any, num_envs: int):
        self.device, self.lanes_per_device = device, num_envs
        #: Per engine: the ``(lanes, agent)`` its last run kept (None once a run
        #: took them) and its first run's zero results (never donated).
        self._spares: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def compile(self, engine: Any, params: Any, segment_steps: int) -> Any:
        """The engine's segment, compiled for these params' shapes."""
        shape = engine.carry_shape()
        carry = (shape.lanes, shape.agent)
        return engine.run_segment.lower(
            build.abstract(params), carry, shape.results, segment_steps
        ).compile(compiler_options(self.device))

    def check_same_everywhere(self, seeds: np.ndarray, params: Any) -> None:
        del seeds, params  # one process runs the whole budget

    def first_carry(self, engine, seeds, record, trials=None, texts=None) -> tuple:
        """``((lanes, agent), results)``, on the engine's kept buffers if any."""
        run = {"record": record, "trials": trials, "texts": texts}
        with self._lock:
            spare, results0 = self._spares.get(engine, (None, None))
            self._spares[engine] = (None, results0)
        if spare is not None and self.device in (None, *spare[0].seeds.devices()):
            carry = refill(engine.config, spare, results0, seeds, self.device, **run)
        else:
            carry = engine.first_carry(seeds, self.device, **run)
            with self._lock:
                self._spares[engine] = (None, carry.results)
        return (carry.lanes, carry.agent), carry.results

    def keep(self, engine: Any, state: Any) -> None:
        with self._lock:
            self._spares[engine] = (state, self._spares[engine][1])

    def put_params(self, params: Any) -> Any:
        return params  # the policy placed them

    def drain(self, state: Any, res: Results, plan: Any) -> tuple:
        """``(log, episodes finished, next unstarted episode)`` in one read."""
        del plan
        log, n_done, next_episode = jax.device_get(
            (res.replace(recording=None), state[0].n_done, state[0].next_episode)
        )
        return log.replace(recording=res.recording), int(n_done), next_episode

    def put_window(self, engine, state, base, seeds, next_episode, trials) -> tuple:
        """``(state, base)`` for the next segment, the window moved if need be."""
        if window_fits(engine.config, int(base), next_episode):
            return state, base
        lanes, ag = state
        trial_of = None if trials is None else trials[0]
        new = window(engine.config, seeds, int(next_episode), trial_of)
        lanes = with_window(lanes, jax.device_put(new, self.device))
        return (lanes, ag), int(new["base"])


class DeviceMesh:
    """Lanes split over a one-axis mesh: device d of D runs episodes d, d + D,
    ... on N / D lanes of its own (``sharded``)."""

    #: D programs' step events have no order.
    supports_step_hooks = False

    def __init__(self, mesh: Any, num_envs: int, policy: Any):
        self.mesh, self.num_devices = mesh, mesh_size(mesh)
        self.lanes_per_device = sharded.split_lanes(num_envs, self.num_devices)
        if policy.device is not None:
            raise ValueError(
                f"policy {policy.name!r} is pinned to {policy.device}, "
                f"but devices= splits the run over {self.num_devices} devices; "
                "build the policy with device=None"
            )
        check_local_share(mesh)
        self._split = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
        self._whole = NamedSharding(mesh, PartitionSpec())

    def compile(self, engine: Any, params: Any, segment_steps: int) -> Any:
        """The engine's segment over the mesh, for carries stacked by device."""
        d, shape = (self.num_devices,), engine.carry_shape()
        spec = lambda s, sharding, lead=(): jax.ShapeDtypeStruct(
            lead + s.shape, s.dtype, sharding=sharding
        )
        stack = lambda tree: jax.tree.map(lambda s: spec(s, self._split, d), tree)
        program = sharded.segment_program(engine, self.mesh, segment_steps)
        return program.lower(
            jax.tree.map(lambda s: spec(s, self._whole), build.abstract(params)),
            stack((shape.lanes, shape.agent)),
            stack(shape.results),
        ).compile(compiler_options(self.mesh.devices.flat[0]))

    def check_same_everywhere(self, seeds: np.ndarray, params: Any) -> None:
        sharded.check_same_everywhere(self.mesh, seeds, params)

    def first_carry(self, engine, seeds, record, trials=None, texts=None) -> tuple:
        """Every device's first carry of its share, stacked along the mesh axis."""
        del record
        shares = sharded.device_seeds(seeds, self.num_devices)
        trial_of = sharded.device_seeds(trials and trials[0], self.num_devices)
        host = host_device()
        carry = self._stack(
            lambda d: jax.device_get(
                engine.first_carry(
                    shares[d], host, None, trials and (trial_of[d], trials[1]), texts
                )
            )
        )
        return (carry.lanes, carry.agent), carry.results

    def _stack(self, build: Any) -> Any:
        """This process's devices' ``build(d)``, stacked along the mesh axis."""
        mine = [
            (dev, build(d))
            for d, dev in enumerate(self.mesh.devices.flat)
            if dev.process_index == jax.process_index()
        ]

        def one(*leaves):
            shape = (self.num_devices,) + np.shape(leaves[0])
            placed = [
                jax.device_put(np.asarray(x)[None], dev)
                for (dev, _), x in zip(mine, leaves, strict=True)
            ]
            return jax.make_array_from_single_device_arrays(shape, self._split, placed)

        return jax.tree.map(one, *(tree for _, tree in mine))

    def keep(self, engine: Any, state: Any) -> None:
        del engine, state  # every run places its carries anew

    def put_params(self, params: Any) -> Any:
        return sharded.put(params, self._whole)

    def drain(self, state: Any, res: Results, plan: Any) -> tuple:
        log, n_done, next_episode = sharded.to_host(
            (res, state[0].n_done, state[0].next_episode), self.mesh
        )
        return sharded.merge_logs(log, plan.lanes), int(np.sum(n_done)), next_episode

    def put_window(self, engine, state, base, seeds, next_episode, trials) -> tuple:
        d_count = self.num_devices
        base = np.broadcast_to(np.asarray(base), (d_count,))
        pairs = zip(base, next_episode, strict=True)
        if all(window_fits(engine.config, int(b), ne) for b, ne in pairs):
            return state, base
        lanes, ag = state
        shares = sharded.device_seeds(seeds, d_count)
        trial_of = sharded.device_seeds(trials and trials[0], d_count)
        windows = [
            window(engine.config, shares[d], int(next_episode[d]), trial_of[d])
            for d in range(d_count)
        ]
        lanes = with_window(lanes, self._stack(lambda d: windows[d]))
        return (lanes, ag), np.array([w["base"] for w in windows])


def placement_for(
    devices: Any, num_envs: int, policy: Any, record: Any = None
) -> SingleDevice | DeviceMesh:
    """The placement of a run's checked ``devices=`` (None: the policy's device)."""
    mesh = resolve_mesh(devices)
    refuse_mesh_record(devices, mesh, record)
    if mesh is None:
        return SingleDevice(policy.device, num_envs)
    return DeviceMesh(mesh, num_envs, policy)


def refuse_mesh_record(devices: Any, mesh: Any, record: Any) -> None:
    """ValueError for ``record=`` with ``devices=`` (``mesh``: not None)."""
    if mesh is None or record is None:
        return
    raise ValueError(
        f"record={record!r} with devices={devices!r}: recorded episodes are kept "
        "on one device; with lanes split over devices the episodes run on "
        "different devices. Record in a run without devices= (e.g. "
        "evaluate(..., seeds=[...], record=...) on the episodes to watch)"
    )
