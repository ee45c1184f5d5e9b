"""``jaxmesh.Ray``'s settings (``jaxmesh.run.host.ray_actors`` runs the actors);
no Ray is imported here."""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Mapping
from typing import Any

from jaxmesh.envs.gymnasium import workers as pool
from jaxmesh.run import checks

#: The backend table's row of Ray actors (``jaxmesh.run.dispatch.route``).
RAY = "ray"
#: A config file's key for ``Ray``'s arguments: ``workers: {ray: {...}}``.
CONFIG_KEY = "ray"


@dataclasses.dataclass(frozen=True)
class Ray:
    """Steps a host-stepped env's lanes in Ray actors (``jaxmesh.evaluate(...,
    workers=jaxmesh.Ray(num_workers=64))``; the ``[ray]`` extra; docs/scale.md).

    Attributes:
      num_workers: actors (at most one per lane); None: one per
        ``num_cpus_per_worker`` CPUs the cluster has.
      address: the cluster to join (``ray.init(address=...)``); None: the
        one ``ray.init()`` finds, or a local one.
      num_cpus_per_worker: CPUs Ray reserves for each actor.
      resources: more for each actor, e.g. ``{"GPU": 1}``.

    Raises:
      TypeError, ValueError: a bad value, naming it.
    """

    num_workers: int | None = None
    address: str | None = None
    num_cpus_per_worker: float = 1
    resources: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        n = self.num_workers
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise (ValueError if isinstance(n, numbers.Integral) else TypeError)(
                    f"Ray(num_workers={n!r}): expected an int >= 1 (the actors that "
                    "step the lanes) or None (one per num_cpus_per_worker CPUs of the "
                    "cluster)"
                )
            object.__setattr__(self, "num_workers", int(n))
        if self.address is not None and (
            not isinstance(self.address, str) or not self.address.strip()
        ):
            raise TypeError(
                f"Ray(address={self.address!r}): expected the cluster's address as "
                "a string (ray.init's: 'auto', 'host:6379', 'ray://host:10001') or "
                "None (the cluster ray.init() finds, or a local one)"
            )
        amount = functools.partial(checks.check_number, optional=False, keep_int=True)
        cpus = amount(
            "num_cpus_per_worker",
            self.num_cpus_per_worker,
            "the CPUs jaxmesh.Ray reserves for each actor",
        )
        object.__setattr__(self, "num_cpus_per_worker", cpus)
        res = self.resources
        if res is not None:
            if not isinstance(res, Mapping):
                raise TypeError(
                    f"Ray(resources={res!r}): expected a mapping of resource name "
                    "to amount per actor, e.g. {'GPU': 1} or {'sim_node': 1}"
                )
            checked = {}
            for name, value in res.items():
                if not isinstance(name, str) or not name:
                    raise TypeError(
                        f"Ray(resources={dict(res)!r}): resource names are strings, "
                        f"got {name!r}"
                    )
                if name == "CPU":
                    raise ValueError(
                        f"Ray(resources={dict(res)!r}): CPUs per actor are "
                        "num_cpus_per_worker=, not a resource"
                    )
                checked[name] = amount(
                    f"resources[{name!r}]",
                    value,
                    "the amount each jaxmesh.Ray actor reserves",
                )
            object.__setattr__(self, "resources", checked)

    def __hash__(self) -> int:
        res = None if self.resources is None else tuple(sorted(self.resources.items()))
        return hash((self.num_workers, self.address, self.num_cpus_per_worker, res))

    def __bool__(self) -> bool:  # workers= given: not in this process
        return True

    def describe(self) -> str:
        """``Ray(...)`` with the fields that differ from their defaults."""
        given = [f"{name}={getattr(self, name)!r}" for name in checks.changed(self)]
        return f"Ray({', '.join(given)})"

    __str__ = describe


def check_source(env: Any, lanes: int, record: Any, check_seeds: bool) -> None:
    """Refuses what Ray actors cannot step, before Ray starts."""
    if not pool.is_source(env):
        raise TypeError(
            f"workers=jaxmesh.Ray(...): env {type(env).__name__} holds env objects "
            "built in this process, which Ray actors cannot share; pass "
            "'gymnasium:<id>', a libero: id, or a zero-argument factory (each "
            "actor calls it), or drop workers="
        )
    if isinstance(env, list) and len(env) < lanes:
        raise ValueError(
            f"workers=jaxmesh.Ray(...): {len(env)} env factories for {lanes} lanes; "
            f"pass one factory per lane (or one for all), or num_envs={len(env)}"
        )
    if record is not None and record.frames:
        raise ValueError(
            "workers=jaxmesh.Ray(...): Record(frames=True) renders the envs, which "
            "live in the Ray actors; record without frames, or drop workers="
        )
    if check_seeds:
        raise ValueError(
            "workers=jaxmesh.Ray(...): check_seeds=True checks an env in this "
            "process; check it first with jaxmesh.check_seeds, or drop workers="
        )


def workers_of(value: Any) -> Any:
    """``RunConfig(workers=)``: an int, None, or a ``Ray`` (also ``{ray: ...}``)."""
    if value is None or isinstance(value, Ray):
        return value
    if not isinstance(value, Mapping):
        return checks.check_int(
            "workers",
            value,
            0,
            "worker processes that step a host-stepped env's lanes (0: in "
            "this process; None: chosen for the machine and the env), or "
            "jaxmesh.Ray(num_workers=N) for Ray actors",
        )
    if set(value) != {CONFIG_KEY}:
        raise ValueError(
            f"workers={dict(value)!r}: a mapping names Ray actors as "
            "{ray: {num_workers: N, address: ..., num_cpus_per_worker: ..., "
            "resources: {...}}}; for worker processes on this machine give an int"
        )
    args = value[CONFIG_KEY]
    if args is None:
        return Ray()
    if not isinstance(args, Mapping):
        if isinstance(args, numbers.Integral) and not isinstance(args, bool):
            return Ray(num_workers=args)
        raise TypeError(
            f"workers={dict(value)!r}: expected ray's arguments as a mapping, e.g. "
            "{ray: {num_workers: 64}}"
        )
    fields = {f.name for f in dataclasses.fields(Ray)}
    unknown = sorted(set(args) - fields)
    if unknown:
        raise ValueError(
            f"workers: ray: unknown key(s) {unknown}; Ray takes {sorted(fields)}"
        )
    return Ray(**args)
