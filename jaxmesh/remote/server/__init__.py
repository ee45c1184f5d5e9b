"""Serve gymnasium envs over gRPC: ``EnvServer`` and ``ServeOptions``.

The server speaks the ``jaxmesh.env.v1`` protocol (``proto/jaxmesh_env.proto``):

- ``Handshake`` declares the spaces, the lane count, the reset options the env
  declares and the capabilities; it opens nothing and may be called any time.
- ``Step`` is the session: one open stream at a time (a second is refused with
  RESOURCE_EXHAUSTED, "busy"). Each request resets lanes and replays chunks of
  actions, stopping a lane at its episode's end; once a lane has ended, further
  actions execute nothing (``steps=0``) until the client resets it. The session
  ends when the client closes or drops the stream, after
  ``idle_timeout_seconds`` without a request or with a reply the client does
  not take (DEADLINE_EXCEEDED), on an error or on shutdown; then every lane is
  "not reset" again.
- ``Shutdown`` stops the server when ``allow_remote_shutdown`` is set.

A malformed request is refused with INVALID_ARGUMENT before anything is
stepped, and the server serves on. An env that raises ends the session with
INTERNAL, the env's message and its traceback in the trailing metadata
(``jaxmesh-env-error``, ``jaxmesh-traceback-bin``); the server serves the next
session. The standard gRPC health service answers SERVING for ``""`` and
``jaxmesh.env.v1.EnvService`` while the server serves.

The envs are stepped by the JAX-free lanes the in-process host loop uses too
(``jaxmesh.envs.gymnasium.lanes``); this module adds what serving needs around
them: the wire's leaves and request checks, the lockstep check of a VectorEnv,
a worker pool, the encoding, sessions and their idle watchdog. It imports no
JAX: gymnasium, numpy, grpc, the codec and those lanes only.

Its modules, each named by what it holds: ``options.py`` (``ServeOptions``,
the request limit, address checks), ``lanes.py`` (the served lanes, their
worker pool, a checked request), ``requests.py`` (parsing and checking a
call), ``sessions.py`` (a session's watchdog, and how shutdown ends one),
``service.py`` (``EnvServer``: lifecycle and the gRPC service) and
``same_host.py`` (the same-host data path an ``EnvServer`` holds).

Example:
    >>> server = EnvServer("gymnasium:CartPole-v1", lanes=4).start()
    >>> server.address  # doctest: +SKIP
    '127.0.0.1:40123'
    >>> server.shutdown()
"""

from jaxmesh.remote.server.options import SERVICE_NAME, ServeOptions
from jaxmesh.remote.server.service import EnvServer

__all__ = ["SERVICE_NAME", "EnvServer", "ServeOptions"]
