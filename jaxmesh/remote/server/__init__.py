"""Serve gymnasium envs over gRPC (``jaxmesh.env.v1``): ``EnvServer`` and
``ServeOptions``; docs/remote.md, "Serving an env". No JAX here: the envs are
stepped by the host loop's lanes (``jaxmesh.envs.gymnasium.lanes``).
"""

from jaxmesh.remote.server.options import SERVICE_NAME, ServeOptions
from jaxmesh.remote.server.service import EnvServer

__all__ = ["SERVICE_NAME", "EnvServer", "ServeOptions"]
