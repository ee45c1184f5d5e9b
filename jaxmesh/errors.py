"""Exceptions a run raises once it is under way (bad input raises ValueError or
TypeError before anything compiles). Each carries ``partial_result``: the
episodes finished before the run stopped (set by ``jaxmesh.evaluate``)."""

from __future__ import annotations

import threading
from typing import Any


class _Partial(Exception):
    """An error of a run: ``partial_result`` is set when the run stops."""

    partial_result: Any = None


class BadValueError(_Partial, ValueError):
    """A bad value met while running (a discrete action out of range, a NaN
    action or reward), raised after the segment it happened in; ``episode``,
    ``seed``, ``step`` (0-based), ``lane`` and ``value`` name where.
    """

    def __init__(self, message: str, *, episode, seed, step, lane, value, kind):
        super().__init__(message)
        self.episode, self.seed, self.step = episode, seed, step
        self.lane, self.value, self.kind = lane, value, kind


class EnvError(_Partial, RuntimeError):
    """An env raised while a run reset or stepped it (its exception is
    ``__cause__``); ``episode``, ``seed``, ``lane``, ``step`` (None while
    resetting) and ``server`` (None in process) name where.
    """

    def __init__(self, message: str, **where):
        super().__init__(message)
        self._locate(**where)

    def _locate(self, episode=None, seed=None, lane=None, step=None, server=None):
        self.episode, self.seed, self.lane = episode, seed, lane
        self.step, self.server = step, server


def describe_env_error(what: str, episode, seed, lane, step, server=None) -> str:
    """The message of an ``EnvError`` naming where the env raised ``what``."""
    doing = (
        f"while resetting episode {episode} (seed {seed})"
        if step is None
        else f"at step {step} of episode {episode} (seed {seed})"
    )
    at = f"lane {lane}" + ("" if server is None else f" of the server at {server}")
    return (
        f"the env raised {what} {doing}, on {at}; the "
        f"run stopped there. Run that episode alone (seeds=[{seed}]) to debug it"
    )


class RemoteError(_Partial, RuntimeError):
    """A served env failed: the server, the connection or the env behind it;
    ``address``: the server's (``host:port``), ``code``: the gRPC status code
    name (e.g. ``"UNAVAILABLE"``) or None."""

    def __init__(self, message: str, *, address: str, code: str | None = None):
        super().__init__(message)
        self.address, self.code = address, code


class RemoteEnvError(RemoteError, EnvError):
    """The env behind a server raised; ``remote_traceback`` is its traceback,
    ``summary`` its exception as the server names it ("Type: message"). Where
    is named as an ``EnvError``'s; from a ``RemoteEnv`` alone only the server's
    ``lane``, its ``phase`` (``"resetting"`` or ``"stepping"``) and the
    ``steps_done`` in the failed call before the one that raised.
    """

    def __init__(
        self,
        message: str,
        *,
        address: str,
        remote_traceback: str = "",
        phase: str | None = None,
        steps_done: int = 0,
        summary: str = "",
        **where,
    ):
        super().__init__(message, address=address, code="INTERNAL")
        self.remote_traceback, self.summary = remote_traceback, summary
        self.phase, self.steps_done = phase, steps_done
        self._locate(**where)


class RemoteConnectionError(RemoteError, ConnectionError):
    """The server cannot be reached, went away, refused the session or timed it
    out."""


class WorkerError(_Partial, RuntimeError):
    """A worker process stepping a host env's lanes died twice while running
    the same episode (``episode``, ``seed``)."""

    def __init__(self, message: str, *, episode: int, seed: int):
        super().__init__(message)
        self.episode, self.seed = episode, seed


class RemotePolicyError(_Partial, RuntimeError):
    """A policy served over openpi's protocol (at the ``ws://`` ``address``)
    failed: unreachable, refused, closed, a server error, a timeout, or a reply
    without usable ``actions``."""

    def __init__(self, message: str, *, address: str):
        super().__init__(message)
        self.address = address


class HostPolicyError(_Partial, RuntimeError):
    """A ``jaxmesh.HostPolicy``'s ``fn`` raised (its exception is ``__cause__``)
    or returned the wrong shape; ``lanes``: the call's, ``episodes`` and
    ``seeds``: theirs."""

    def __init__(
        self,
        message: str,
        *,
        policy: str,
        lanes: list[int],
        episodes: list[int] | None = None,
        seeds: list[int] | None = None,
    ):
        super().__init__(message)
        self.policy, self.lanes = policy, lanes
        self.episodes, self.seeds = episodes, seeds

    def named(self, seeds: Any) -> HostPolicyError:
        """This error naming each lane's episode and seed (``seeds``: the run's,
        by episode) when its episodes are known; else itself."""
        if self.episodes is None or self.seeds is not None:
            return self
        got = [int(seeds[i]) for i in self.episodes]
        where = ", ".join(
            f"lane {j}: episode {i}, seed {s}"
            for j, i, s in zip(self.lanes, self.episodes, got, strict=True)
        )
        named = HostPolicyError(
            f"{self} ({where})",
            policy=self.policy,
            lanes=self.lanes,
            episodes=self.episodes,
            seeds=got,
        )
        named.__cause__ = self.__cause__
        return named


#: Errors raised inside host callbacks, kept until the run that met them
#: takes them: JAX reports such an error as its own, carrying only the text.
_CALLBACK_ERRORS: list[BaseException] = []
_CALLBACK_LOCK = threading.Lock()


def keep_callback_error(exc: BaseException) -> BaseException:
    """Keeps ``exc``, raised in a host callback, for ``callback_error``."""
    with _CALLBACK_LOCK:
        _CALLBACK_ERRORS.append(exc)
        del _CALLBACK_ERRORS[:-8]
    return exc


def callback_error(exc: BaseException) -> BaseException:
    """The kept callback error whose text ``exc`` carries (taken), else
    ``exc``."""
    text = str(exc)
    with _CALLBACK_LOCK:
        for i, kept in enumerate(_CALLBACK_ERRORS):
            if kept is not exc and str(kept) in text:
                del _CALLBACK_ERRORS[i]
                return kept
    return exc
