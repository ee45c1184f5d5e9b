"""``workers=jaxmesh.Ray(...)``: ``RayServers``, served lanes over env servers
in Ray actors (``jaxmesh.remote.server.actor.EnvActor``); Ray is imported on use.
"""

from __future__ import annotations

import contextlib
import secrets
import time
import warnings
from collections.abc import Iterator
from typing import Any

from jaxmesh.remote.server.actor import EnvActor
from jaxmesh.run import kept
from jaxmesh.run.cluster import Ray
from jaxmesh.run.host.served import ServedLanes, ServedRun, ServedStepRun

#: Seconds the actors have to be placed, build their envs and serve.
START_SECONDS = 600.0
#: Seconds a graceful stop may take at the end before the actors are killed.
STOP_SECONDS = 5.0
#: Actors' names start with this (``ray list actors``).
NAME_PREFIX = "jaxmesh-env"
#: Ray restarts an actor that died other than by ``ray.kill`` this many times;
#: its lanes rejoin the run at the new address (``RayServers.reconnect``).
MAX_RESTARTS = 1


def import_ray() -> Any:
    """The ``ray`` module; ImportError naming the extra without it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "workers=jaxmesh.Ray(...) needs Ray: pip install 'jaxmesh[ray]' (or "
            f"pip install 'ray>=2.40') ({exc})"
        ) from exc
    return ray


def connect(ray: Any, cfg: Ray) -> bool:
    """Connects to Ray unless connected; whether it did."""
    if ray.is_initialized():
        return False
    with warnings.catch_warnings():
        # Ray starts its processes with fork + exec, which JAX's fork warning
        # cannot tell from a bare fork.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning, "subprocess")
        ray.init(address=cfg.address, logging_level="WARNING")
    return True


@contextlib.contextmanager
def connection(workers: Any) -> Iterator[None]:
    """One Ray connection held for the block if ``workers`` is a ``Ray``."""
    ray = import_ray() if isinstance(workers, Ray) else None
    started = ray is not None and connect(ray, workers)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


class RayFleet:
    """A run's (or a ``kept.kept_processes`` block's) env servers in Ray actors,
    actor ``s`` serving lanes ``s, s + A, ...``. ImportError without Ray,
    TimeoutError past ``START_SECONDS``, or an actor's error building its envs."""

    def __init__(self, env: Any, num_lanes: int, cfg: Ray):
        ray = self.ray = import_ray()
        self.actors: list = []
        self.started_ray = False
        self.runs = 0  # the runs served (``RayServers.of``)
        try:
            self.started_ray = connect(ray, cfg)
            count = cfg.num_workers
            if count is None:
                cpus = float(ray.cluster_resources().get("CPU", 1))
                count = max(1, int(cpus // cfg.num_cpus_per_worker))
            count = max(1, min(count, num_lanes))
            if self.started_ray and cfg.address is None:  # can it place them?
                have = ray.cluster_resources()
                asked = {"CPU": cfg.num_cpus_per_worker, **(cfg.resources or {})}
                short = {k: v * count for k, v in asked.items()}
                short = {k: v for k, v in short.items() if v > have.get(k, 0) + 1e-9}
                if short:
                    name = next(iter(short))
                    raise ValueError(
                        f"{cfg.describe()}: {count} actors need {short[name]:g} "
                        f"{name} in all; the local Ray started for this run has "
                        f"{have.get(name, 0):g}: pass fewer num_workers=, a smaller "
                        "num_cpus_per_worker= (e.g. 0.5), or join a cluster "
                        "(Ray(address=...), RAY_ADDRESS, or ray.init(...) before "
                        "the run)"
                    )
            res = dict(cfg.resources or {})
            options = {
                "num_cpus": cfg.num_cpus_per_worker,
                "max_restarts": MAX_RESTARTS,
            }
            if "GPU" in res:
                options["num_gpus"] = res.pop("GPU")
            if res:
                options["resources"] = res
            self.token = secrets.token_urlsafe(24)
            remote, run = ray.remote(EnvActor), secrets.token_hex(4)
            for s in range(count):
                name = f"{NAME_PREFIX}-{run}-{s}"
                mine = list(range(s, num_lanes, count))
                named = remote.options(name=name, **options)
                self.actors.append(named.remote(env, mine, self.token))
            # Each actor's address once it serves.
            refs = [a.serve.remote() for a in self.actors]
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=START_SECONDS)
            if pending:
                have = ray.available_resources()
                raise TimeoutError(
                    f"{len(pending)} of {len(refs)} Ray actors were not serving after "
                    f"{START_SECONDS:g} s; each asks for {cfg.num_cpus_per_worker} CPU"
                    + (f" and {cfg.resources}" if cfg.resources else "")
                    + f", and the cluster has {have} free: ask for fewer "
                    "(num_workers=, num_cpus_per_worker=, resources=) or add nodes"
                )
            self.addresses = []
            for s, ref in enumerate(refs):
                try:
                    self.addresses.append(ray.get(ref))
                except ray.exceptions.RayTaskError as exc:  # the env's own error
                    cause = exc.cause
                    if cause is None:
                        raise
                    cause.add_note(f"(in Ray actor {s}, building its envs)")
                    raise cause from None
                except ray.exceptions.RayActorError as exc:
                    exc.add_note(
                        f"Ray actor {s} died before serving its envs: is jaxmesh (with "
                        "the env's packages) installed on every node of the cluster?"
                    )
                    raise
        except BaseException:
            self.end()
            raise
        nodes = {a.rpartition(":")[0] for a in self.addresses}
        self.where = (
            f"{count} Ray actor{'s' * (count > 1)} on {len(nodes)} "
            f"node{'s' * (len(nodes) > 1)}"
        )

    def alive(self) -> bool:
        """Whether every actor still answers (within ``STOP_SECONDS``)."""
        refs = [a.__ray_ready__.remote() for a in self.actors]
        try:
            self.ray.get(refs, timeout=STOP_SECONDS)
        except Exception:  # an actor died (or does not answer)
            return False
        return True

    def end(self) -> None:
        """Ends every actor and a Ray this fleet started; idempotent."""
        actors, self.actors, ray = self.actors, [], self.ray
        if actors:
            stops = []
            for a in actors:
                with contextlib.suppress(Exception):  # dead already
                    stops.append(a.stop.remote())
            with contextlib.suppress(Exception):  # the kill below ends them
                ray.wait(stops, num_returns=len(stops), timeout=STOP_SECONDS)
            for a in actors:
                with contextlib.suppress(Exception):  # dead already
                    ray.kill(a, no_restart=True)
            # Until each is known dead (a call on it fails), at most STOP_SECONDS.
            end = time.monotonic() + STOP_SECONDS
            for a in actors:
                with contextlib.suppress(Exception):  # dead, as asked
                    left = max(end - time.monotonic(), 0)
                    ray.get(a.__ray_ready__.remote(), timeout=left)
        if self.started_ray:
            self.started_ray = False
            ray.shutdown()


class RayServers(ServedLanes):
    """Served lanes over a ``RayFleet``, lane j on actor ``j % A``; ``kept``:
    the fleet serves later runs too (``close`` leaves it running)."""

    loop, fast = ServedRun, ServedStepRun

    def __init__(self, fleet: RayFleet, num_lanes: int, served: Any, kept: bool):
        self.fleet, self.kept = fleet, kept
        super().__init__(
            fleet.addresses,
            num_lanes,
            token=fleet.token,
            reply_timeout=served.reply_timeout,
            on_server_loss="rerun",
            transport=served.transport or "auto",
        )
        self.where = fleet.where

    @classmethod
    def of(cls, env: Any, num_envs: int, episodes: int, cfg: Ray, served: Any):
        """The lanes of a Ray run (``dispatch.Route.lanes``)."""
        n = max(1, min(num_envs, episodes))
        key, start = ("ray", env, n, cfg), lambda: RayFleet(env, n, cfg)
        fleet, is_kept = kept.started(key, start, RayFleet.end)
        if fleet.runs and not fleet.alive():
            kept.forget(fleet)
            fleet, is_kept = kept.started(key, start, RayFleet.end)
        fleet.runs += 1
        try:
            return cls(fleet, n, served, is_kept)
        except BaseException:
            if is_kept:
                kept.forget(fleet)
            else:
                fleet.end()
            raise

    def reconnect(self, s: int, connect_timeout: float) -> Any:
        """A session with actor ``s`` again, once Ray restarted it (serving at
        its old port where it can; an error: gone for good, or not yet)."""
        fleet = self.fleet
        port = int(fleet.addresses[s].rpartition(":")[2])
        serving = fleet.actors[s].serve.remote(port=port)
        address = fleet.ray.get(serving, timeout=connect_timeout)
        self.addresses[s] = fleet.addresses[s] = address
        return super().reconnect(s, connect_timeout)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if not self.kept:
                self.fleet.end()


__all__ = [
    "RayFleet",
    "RayServers",
    "connect",
    "connection",
    "import_ray",
    "NAME_PREFIX",
]
