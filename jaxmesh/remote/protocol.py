"""The wire protocol's names and limits, written once.

Both ends of the gRPC boundary import them from here: the server, the client
session, ``RemoteEnv`` / ``RemoteVectorEnv``, the served host loop, and the
in-process gymnasium lanes (which pass the same reset option to a local env).
The messages themselves are ``proto/jaxmesh_env.proto``; ``codec`` encodes them.

This module imports nothing (the standard library aside), so the JAX-free
server, the codec and a plain install without the ``[remote]`` extra can all
read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np

#: Protocol versions this side speaks, newest last (the handshake picks the
#: newest both sides speak).
PROTOCOL_VERSIONS: tuple[int, ...] = (1,)

#: The default cap on one message, at both ends (256 MiB).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: The most actions one lane may replay in one call.
MAX_COUNT = 1_000_000

#: The dtype names an array may have on the wire (little-endian on the wire;
#: ``codec.DTYPES`` maps them to numpy dtypes).
DTYPE_NAMES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)

#: The environment variable the session token is read from when none is given
#: (client and server; named in their errors).
TOKEN_ENV = "JAXMESH_TOKEN"

#: The key of the one observation leaf of a single-array observation (a Dict or
#: Tuple one has a leaf per entry, named by its path joined with "/"), and of the
#: one action leaf, in a batch.
OBS_KEY = ""
#: The reset option that carries an episode's trial index to an env that takes
#: it (a server declares it in the handshake when its env does).
TRIAL_INDEX = "trial_index"

#: Capabilities a server declares in the handshake. Every server declares
#: ``CAPABILITIES``; a server over a ``VectorEnv`` adds ``LOCKSTEP``: it steps
#: every lane at once, so the client sends one call at a time with every lane's
#: segment cut to the same length. ``INFO_EVERY_STEP``: the server honours a
#: request's ``info_every_step`` (every executed step's info, only the last
#: observation); a client asks an older server for every observation instead.
CHUNK_REPLAY = "chunk_replay"
INFO_KEYS = "info_keys"
INFO_EVERY_STEP = "info_every_step"
MAX_EPISODE_SECONDS = "max_episode_seconds"
LOCKSTEP = "lockstep"
#: The server offers the same-host data path (``jaxmesh.remote.shm``): the
#: handshake's ``shared_memory`` names its abstract Unix socket.
SHARED_MEMORY = "shared_memory"
CAPABILITIES = (CHUNK_REPLAY, INFO_KEYS, INFO_EVERY_STEP, MAX_EPISODE_SECONDS)

#: How a session's calls travel: ``"auto"`` (the same-host data path when the
#: server offers it and it attaches, else gRPC), ``"grpc"`` or ``"shm"`` (the
#: same-host data path or an error).
TRANSPORTS = ("auto", "grpc", "shm")


def check_transport(value: object) -> str:
    """``transport`` as one of ``TRANSPORTS``.

    Raises:
      ValueError: any other value.
    """
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


class ResultBatch(NamedTuple):
    """What lanes did in one call, as numpy: the wire's ``ResultBatch``.

    The gymnasium lanes (``jaxmesh.envs.gymnasium.lanes``) return it, the
    codec encodes it (``codec.encode_result_batch(*batch)``) and decodes a
    reply into it, and the host loop reads it the same way from either.

    Attributes:
      lanes: int64 ``[m]``, ascending: every lane reset or stepped.
      steps: int64 ``[m]``: env steps executed (0 for a reset, or for a lane
        whose episode had ended).
      rows: int64 ``[m]``: observation rows: 1 for a reset; for a replay
        ``steps`` rows when every observation is kept, else ``min(steps, 1)``.
      rewards: float64 ``[sum(steps)]``, lane after lane.
      terminated: bool ``[sum(steps)]``.
      truncated: bool ``[sum(steps)]`` (a wall-clock cap sets it too).
      observation: ``{"": array [sum(rows), *obs_shape]}`` when observations
        were asked for, else ``{}``; for a Dict or Tuple observation, leaf
        name -> ``[sum(rows), *leaf_shape]`` for the leaves asked for.
      info: info key -> ``[sum(info rows), ...]`` in the values' own dtype,
        for the keys asked for that some row has (and whose values are numbers
        of one shape); a row without the key holds zeros.
      info_present: info key -> bool ``[sum(info rows)]`` for a key that some
        rows lack (True: the row has it); a key every row has is not here.
      info_rows: int64 ``[m]``: info rows per lane, when they differ from
        ``rows`` (every executed step's info with only the last observation:
        1 for a reset, ``steps`` for a replay); None: the info rows are
        ``rows``.
    """

    lanes: np.ndarray
    steps: np.ndarray
    rows: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    observation: dict[str, np.ndarray]
    info: dict[str, np.ndarray]
    info_present: dict[str, np.ndarray] | None = None
    info_rows: np.ndarray | None = None

    @property
    def info_row_counts(self) -> np.ndarray:
        """int64 ``[m]``: the info rows of each lane (``info_rows`` or ``rows``)."""
        return self.rows if self.info_rows is None else self.info_rows


__all__ = [
    "CAPABILITIES",
    "CHUNK_REPLAY",
    "DTYPE_NAMES",
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
    "ResultBatch",
    "SHARED_MEMORY",
    "TOKEN_ENV",
    "TRACEBACK_KEY",
    "TRANSPORTS",
    "TRIAL_INDEX",
    "check_transport",
]
