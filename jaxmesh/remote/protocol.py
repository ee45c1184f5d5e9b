"""The wire protocol's names and limits, written once for both ends (it
imports nothing, so an install without the ``[remote]`` extra reads it too).
"""

from __future__ import annotations

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

#: The key of the one observation leaf of a single-array observation, and of
#: the one action leaf, in a batch.
OBS_KEY = ""
#: Capabilities a server declares in the handshake: every server
#: ``CAPABILITIES``; one over a ``VectorEnv`` adds ``LOCKSTEP`` (it steps every
#: lane at once: one call at a time, every lane's segment of the same length).
CHUNK_REPLAY = "chunk_replay"
INFO_KEYS = "info_keys"
INFO_EVERY_STEP = "info_every_step"
MAX_EPISODE_SECONDS = "max_episode_seconds"
LOCKSTEP = "lockstep"
#: The server offers the same-host data path (``jaxmesh.remote.shm``): the
#: handshake's ``shared_memory`` names its abstract Unix socket.
SHARED_MEMORY = "shared_memory"
CAPABILITIES = (CHUNK_REPLAY, INFO_KEYS, INFO_EVERY_STEP, MAX_EPISODE_SECONDS)

#: How a session's calls travel (``check_transport`` says what each means).
TRANSPORTS = ("auto", "grpc", "shm")


def check_transport(value: object) -> str:
    """``transport`` as one of ``TRANSPORTS`` (ValueError)."""
    if not isinstance(value, str) or value not in TRANSPORTS:
        raise ValueError(
            f"transport={value!r}: expected 'auto' (shared memory with a server on "
            "this host, else gRPC), 'grpc' (always the gRPC stream) or 'shm' "
            "(shared memory, an error when the server is not on this host)"
        )
    return value


#: Trailing metadata keys of an env error: its one-line summary, and the
#: server-side traceback (binary metadata, hence the ``-bin`` suffix).
ENV_ERROR_KEY = "jaxmesh-env-error"
TRACEBACK_KEY = "jaxmesh-traceback-bin"
#: Beside them, where: "<lane> <resetting|stepping> <steps>", the server's lane
#: and the steps it took in the failed call before the one that raised.
ENV_LANE_KEY = "jaxmesh-env-lane"


__all__ = [
    "CAPABILITIES",
    "CHUNK_REPLAY",
    "ENV_ERROR_KEY",
    "ENV_LANE_KEY",
    "INFO_EVERY_STEP",
    "INFO_KEYS",
    "LOCKSTEP",
    "MAX_COUNT",
    "MAX_EPISODE_SECONDS",
    "MAX_MESSAGE_BYTES",
    "OBS_KEY",
    "PROTOCOL_VERSIONS",
    "SHARED_MEMORY",
    "TOKEN_ENV",
    "TRACEBACK_KEY",
    "TRANSPORTS",
    "check_transport",
]
