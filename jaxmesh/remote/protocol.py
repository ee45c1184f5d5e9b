"""The wire protocol's names and limits, written once.

Both ends of the gRPC boundary import them from here: the server, the client
session, ``RemoteEnv`` / ``RemoteVectorEnv``, the served host loop, and the
in-process gymnasium lanes (which pass the same reset option to a local env).
The messages themselves are ``proto/jaxmesh_env.proto``; ``codec`` encodes them.

This module imports nothing, so the JAX-free server, the codec and a plain
install without the ``[remote]`` extra can all read it.
"""

#: Protocol versions this side speaks, newest last (the handshake picks the
#: newest both sides speak).
PROTOCOL_VERSIONS: tuple[int, ...] = (1,)

#: The default cap on one message, at both ends (256 MiB).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: The most actions one lane may replay in one call.
MAX_COUNT = 1_000_000

#: The environment variable the session token is read from when none is given
#: (client and server; named in their errors).
TOKEN_ENV = "JAXMESH_TOKEN"

#: The key of the one observation leaf, and of the one action leaf, in a batch.
OBS_KEY = ""
#: The reset option that carries an episode's trial index to an env that takes
#: it (a server declares it in the handshake when its env does).
TRIAL_INDEX = "trial_index"

#: Capabilities a server declares in the handshake. Every server declares
#: ``CAPABILITIES``; a server over a ``VectorEnv`` adds ``LOCKSTEP``: it steps
#: every lane at once, so the client sends one call at a time with every lane's
#: segment cut to the same length.
CHUNK_REPLAY = "chunk_replay"
INFO_KEYS = "info_keys"
MAX_EPISODE_SECONDS = "max_episode_seconds"
LOCKSTEP = "lockstep"
CAPABILITIES = (CHUNK_REPLAY, INFO_KEYS, MAX_EPISODE_SECONDS)

#: Trailing metadata keys of an env error: its one-line summary, and the
#: server-side traceback (binary metadata, hence the ``-bin`` suffix).
ENV_ERROR_KEY = "jaxmesh-env-error"
TRACEBACK_KEY = "jaxmesh-traceback-bin"

__all__ = [
    "CAPABILITIES",
    "CHUNK_REPLAY",
    "ENV_ERROR_KEY",
    "INFO_KEYS",
    "LOCKSTEP",
    "MAX_COUNT",
    "MAX_EPISODE_SECONDS",
    "MAX_MESSAGE_BYTES",
    "OBS_KEY",
    "PROTOCOL_VERSIONS",
    "TOKEN_ENV",
    "TRACEBACK_KEY",
    "TRIAL_INDEX",
]
