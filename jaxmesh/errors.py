"""Exceptions a run raises once it is under way (bad input raises ValueError /
TypeError before anything compiles)."""

from __future__ import annotations


class BadValueError(ValueError):
    """A bad value met while running: a discrete action out of range, a NaN action,
    a NaN reward from the env.

    Detected on the device (a flag in the scan's carry) and raised after the
    segment it happened in. Attributes name where: ``episode`` (its index),
    ``seed``, ``step`` (0-based env step of the episode), ``lane`` and ``value``;
    ``partial_result`` holds every episode finished before the run stopped.
    """

    def __init__(self, message: str, *, episode, seed, step, lane, value, kind):
        super().__init__(message)
        self.episode = episode
        self.seed = seed
        self.step = step
        self.lane = lane
        self.value = value
        self.kind = kind
        self.partial_result = None


class RemoteError(RuntimeError):
    """A served env failed: the server, the connection or the env behind it.

    Attributes:
      address: the server's address (``host:port``).
      code: the gRPC status code name (e.g. ``"UNAVAILABLE"``), or None.
      partial_result: every episode finished before the run stopped (set by
        ``jaxmesh.evaluate``).
    """

    def __init__(self, message: str, *, address: str, code: str | None = None):
        super().__init__(message)
        self.address = address
        self.code = code
        self.partial_result = None


class RemoteEnvError(RemoteError):
    """The env behind a server raised; ``remote_traceback`` is its traceback text.

    The server ends the session and serves the next one.
    """

    def __init__(self, message: str, *, address: str, remote_traceback: str = ""):
        super().__init__(message, address=address, code="INTERNAL")
        self.remote_traceback = remote_traceback


class RemoteConnectionError(RemoteError, ConnectionError):
    """The server cannot be reached, went away, refused the session or timed it
    out."""


class WorkerError(RuntimeError):
    """A worker process stepping a host env's lanes died twice while running
    the same episode (``episode``, ``seed``); ``partial_result`` holds every
    episode finished before the run stopped."""

    def __init__(self, message: str, *, episode: int, seed: int):
        super().__init__(message)
        self.episode = episode
        self.seed = seed
        self.partial_result = None
