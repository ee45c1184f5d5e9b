"""The wire protocol's names and limits for both ends (importable without the
``[remote]`` extra)."""

from __future__ import annotations

#: Protocol versions this side speaks (the handshake picks the newest shared).
PROTOCOL_VERSIONS: tuple[int, ...] = (1,)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # at both ends
MAX_COUNT = 1_000_000  # actions one lane may replay in one call
#: Where the session token is read from when none is given (both ends).
TOKEN_ENV = "JAXMESH_TOKEN"
#: The key of a single-array observation's one leaf, and of the action leaf.
OBS_KEY = ""
#: Capabilities: every server declares ``CAPABILITIES``; one over a
#: ``VectorEnv`` adds ``LOCKSTEP`` (every lane stepped at once, by one count).
CHUNK_REPLAY = "chunk_replay"
INFO_KEYS = "info_keys"
INFO_EVERY_STEP = "info_every_step"
MAX_EPISODE_SECONDS = "max_episode_seconds"
LOCKSTEP = "lockstep"
#: The same-host data path is offered at the handshake's ``shared_memory`` socket.
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


#: Trailing metadata of an env error: its summary, the server's traceback
#: (binary: ``-bin``) and "<lane> <resetting|stepping> <steps done before>".
ENV_ERROR_KEY = "jaxmesh-env-error"
TRACEBACK_KEY = "jaxmesh-traceback-bin"
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
