"""Serve gymnasium envs over gRPC: ``EnvServer`` and ``ServeOptions``.

The server speaks the ``jaxmesh.env.v1`` protocol (``proto/jaxmesh_env.proto``):
``Handshake`` declares the spaces, lanes, reset options and capabilities;
``Step`` is the session, one at a time; ``Shutdown`` stops the server when
``allow_remote_shutdown`` is set. docs/remote.md gives the sessions, the faults
and their gRPC status codes. The envs are stepped by the JAX-free lanes the
in-process host loop uses too (``jaxmesh.envs.gymnasium.lanes``); no JAX here.

Example:
    >>> server = EnvServer("gymnasium:CartPole-v1", lanes=4).start()
    >>> server.shutdown()
"""

from jaxmesh.remote.server.options import SERVICE_NAME, ServeOptions
from jaxmesh.remote.server.service import EnvServer

__all__ = ["SERVICE_NAME", "EnvServer", "ServeOptions"]
