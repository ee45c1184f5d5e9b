"""The backend table (docs/architecture.md): ``target`` tells an env's kind once,
``route`` maps it to the row that runs it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from jaxmesh import envs
from jaxmesh.envs import gymnasium as gym_lanes
from jaxmesh.remote.address import require_grpc
from jaxmesh.run import backend, host, kept, scan
from jaxmesh.run.backend import LOCAL, RECORDING, SCAN, SERVED, WORKERS, Target
from jaxmesh.run.cluster import RAY, Ray
from jaxmesh.run.host.loop import GroupedRun, LocalRun


def target(env: Any, env_config: Any = None) -> Target:
    """``env`` (an id made with ``env_config``'s options) and its backend."""
    if env_config is not None and not isinstance(env_config, Mapping):
        raise TypeError(
            f"env_config={env_config!r}: expected a mapping of the env's options "
            "(passed as jaxmesh.make_env(env, **env_config))"
        )
    is_id = isinstance(env, str) and env.partition(":")[0] in envs.PREFIXES
    if env_config and not is_id:
        raise TypeError(
            f"env_config={dict(env_config)!r} with env {env!r}: env_config only "
            f"applies to env ids with a prefix of {list(envs.PREFIXES)}; build the "
            "env with its options yourself, or give an id"
        )
    if is_id and (env_config or env.startswith("libero:")):
        env = envs.make_env(env, **dict(env_config or {}))
    return Target(env, backend.backend_of(env))  # an address is no id


class Route(NamedTuple):
    """A row of the backend table: what ``jaxmesh.evaluate`` calls; a host row's
    lanes, loop class, and a faster one taken when it ``applies``."""

    name: str
    evaluate: Callable[..., Any]
    lanes: Callable[..., Any] | None = None
    loop: Any = None
    fast: Any = None

    def loop_for(self, program: Any, lanes: Any, recorder: Any) -> Any:
        if self.fast is not None and self.fast.applies(program, lanes, recorder):
            return self.fast
        return self.loop


def route(target: Target, *, workers: int | Ray = 0, record: Any = None) -> Route:
    """The first row of the backend table that runs ``target`` with these options."""
    if target.kind == SCAN:
        return Route(SCAN, scan.run)
    if target.kind == SERVED:
        require_grpc()
        from jaxmesh.run.host import served  # the [remote] extra: gRPC

        row = (served.ServedLanes.of, served.ServedRun, served.ServedStepRun)
        return Route(SERVED, evaluate_host, *row)
    if isinstance(workers, Ray):
        require_grpc()
        from jaxmesh.run.host.ray_actors import RayServers  # the [ray] extra

        row = (RayServers.of, RayServers.loop, RayServers.fast)
        return Route(RAY, evaluate_host, *row)
    if workers:
        return Route(WORKERS, evaluate_host, worker_lanes, LocalRun, GroupedRun)
    if records_frames(target.env, record):
        return Route(RECORDING, evaluate_host, recording_lanes, LocalRun)
    lanes = lambda env, n, e, w, served: gym_lanes.make_lanes(env, n, e)
    return Route(LOCAL, evaluate_host, lanes, LocalRun)


def worker_lanes(env: Any, num_envs: int, episodes: int, workers: int, *_: Any):
    """Lanes in ``workers`` worker processes (``kept.started``'s)."""
    n = max(1, min(num_envs, episodes))
    lanes, is_kept = kept.started(
        ("workers", env, n, workers),
        lambda: gym_lanes.WorkerEnvLanes(env, n, workers),
        lambda lanes: lanes.pool.close(),
    )
    lanes.kept, lanes.lost, lanes.culprits = is_kept, [], []
    return lanes


def records_frames(env: Any, record: Any) -> bool:
    """Whether a recording wants frames of ``"gymnasium:<id>"`` envs made here."""
    if record is None or record.frames is False or not isinstance(env, str):
        return False
    name = env.partition(":")[2]
    return ":" in name or name in gym_lanes.import_gymnasium().registry


def recording_lanes(env: str, num_envs: int, episodes: int, *_: Any) -> Any:
    """``"gymnasium:<id>"`` lanes made with ``render_mode="rgb_array"``."""
    gym = gym_lanes.import_gymnasium()
    made: list = []
    try:
        for _ in range(max(1, min(num_envs, episodes))):
            made.append(gym.make(env.partition(":")[2], render_mode="rgb_array"))
        return gym_lanes.EnvLanes(made, owned=True)
    except BaseException:
        for e in made:
            e.close()
        raise


def evaluate_host(policy: Any, env: Any, config: Any, **given: Any) -> Any:
    """The host rows' entry: ``jaxmesh.run.host.run_host`` with this table."""
    return host.run_host(policy, env, config, route=route, **given)
