"""``EnvActor``: what one Ray actor of ``workers=jaxmesh.Ray(...)`` runs: its
share of a run's lanes, served by an ``EnvServer`` on its node behind the
run's token. Plain Python (``jaxmesh.run.host.ray_actors`` makes it a Ray
actor), importing no JAX.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from jaxmesh.envs.gymnasium.workers import build_envs
from jaxmesh.remote.server.options import ServeOptions
from jaxmesh.remote.server.service import EnvServer


class EnvActor:
    """A Ray actor's envs, served (``serve``) until ``stop`` or its end.

    Args:
      source: ``"gymnasium:<id>"``, a zero-argument factory of a gymnasium
        ``Env``, or a list of them (one per lane of the run).
      lanes: the run's lanes this actor steps (their indices pick a list's
        factories).
      token: the run's session token: the server refuses any other client.
      options: more ``ServeOptions`` fields (e.g. ``shared_memory=False``).
    """

    def __init__(
        self,
        source: Any,
        lanes: Sequence[int],
        token: str,
        options: Mapping[str, Any] | None = None,
    ):
        self.source = source
        self.lanes = list(lanes)
        self.token = token
        self.options = dict(options or {})
        self.server: EnvServer | None = None

    def serve(self, host: str | None = None, port: int = 0) -> str:
        """Builds the envs and starts their server; its ``"grpc://host:port"``.

        ``host``: the address to bind (None: this node's, as Ray knows it);
        ``port``: the port to bind (a restarted actor's old one), else a free
        one (0, or that port is taken).
        """
        if self.server is None:
            if host is None:
                import ray  # in an actor: Ray is there

                host = ray.util.get_node_ip_address()
            options = ServeOptions(token=self.token, **self.options)
            bound = f"[{host}]" if ":" in host else host  # IPv6
            make = functools.partial(build_envs, self.source, self.lanes)
            try:
                server = EnvServer(make, f"{bound}:{port}", options=options).start()
            except OSError:  # the port is taken: any free one
                if not port:
                    raise
                server = EnvServer(make, f"{bound}:0", options=options).start()
            self.server = server
        return "grpc://" + self.server.address

    def stop(self) -> None:
        """Ends the server: its session, then its envs (closed)."""
        if self.server is not None:
            self.server.shutdown()


__all__ = ["EnvActor"]
