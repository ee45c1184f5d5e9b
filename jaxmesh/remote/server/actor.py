"""``EnvActor``: one Ray actor of ``workers=jaxmesh.Ray(...)``, serving its share
of a run's lanes behind the run's token (``jaxmesh.run.host.ray_actors``)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from jaxmesh.envs.gymnasium.workers import build_envs
from jaxmesh.remote.server.options import ServeOptions
from jaxmesh.remote.server.service import EnvServer


@dataclasses.dataclass(eq=False)
class EnvActor:
    """A Ray actor's envs, served (``serve``) until ``stop`` or its end.

    Attributes:
      source: ``"gymnasium:<id>"``, a factory of a gymnasium ``Env``, or a list
        of them (one per lane of the run).
      lanes: the run's lanes this actor steps.
      token: the run's session token.
      options: more ``ServeOptions`` fields.
    """

    source: Any
    lanes: Sequence[int]
    token: str
    options: Mapping[str, Any] | None = None
    server: EnvServer | None = dataclasses.field(default=None, init=False)

    def serve(self, host: str | None = None, port: int = 0) -> str:
        """Builds the envs and serves them at ``host`` (None: this node's) and
        ``port`` (a restarted actor's old one, else a free one); the address."""
        if self.server is None:
            if host is None:
                import ray  # in an actor: Ray is there

                host = ray.util.get_node_ip_address()
            options = ServeOptions(token=self.token, **(self.options or {}))
            bound = f"[{host}]" if ":" in host else host  # IPv6
            make = functools.partial(build_envs, self.source, list(self.lanes))
            try:
                server = EnvServer(make, f"{bound}:{port}", options=options).start()
            except OSError:  # the port is taken: any free one
                if not port:
                    raise
                server = EnvServer(make, f"{bound}:0", options=options).start()
            self.server = server
        return "grpc://" + self.server.address

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
