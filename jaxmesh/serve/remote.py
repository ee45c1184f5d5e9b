"""``jaxmesh.RemotePolicy``: a served policy as the policy of ``jaxmesh.evaluate``
on host-stepped envs; over gRPC only the agent step moves to the server
(docs/serving.md, "jaxmesh's own protocol: RemotePolicy").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
from typing import Any

import grpc
import jax
import numpy as np

from jaxmesh import adapt
from jaxmesh.core import agent
from jaxmesh.errors import RemoteConnectionError
from jaxmesh.remote.address import parse_address, uses_tls
from jaxmesh.remote.client import open_channel
from jaxmesh.remote.protocol import MAX_MESSAGE_BYTES
from jaxmesh.run.host.driver import _HostProgram
from jaxmesh.serve import codec
from jaxmesh.serve.agents import SETTINGS, spec_to_wire
from jaxmesh.serve.grpc_service import METHOD
from jaxmesh.serve.ws_client import SCHEMES as WS_SCHEMES
from jaxmesh.serve.ws_client import WebsocketPolicy, check_seconds, env_token
from jaxmesh.types import Policy

#: Seconds ``GrpcPolicy`` waits for the server to answer its connection.
CONNECT_TIMEOUT_SECONDS = 10.0
_END = object()


def _refuse_apply(*args: Any, **kwargs: Any) -> Any:
    raise TypeError(
        "jaxmesh.RemotePolicy runs on host-stepped envs (gymnasium envs, in "
        "process, in workers or served), where the host loop calls the server "
        "for each agent step; a JAX env runs its policy inside one jitted "
        "program, which cannot call a server: serve the env instead, or run "
        "the model in process"
    )


def RemotePolicy(address: str, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
    """A policy served by another process: a ``ws_client.WebsocketPolicy``
    for a ``ws://`` or ``wss://`` address (openpi's protocol), else (``host:port``,
    ``grpc://``, ``grpcs://``) a ``GrpcPolicy``; arguments: docs/policies.md.

    Example::

        policy = jaxmesh.RemotePolicy("ws://127.0.0.1:8000")
        result = jaxmesh.evaluate(policy, "gymnasium:CartPole-v1", episodes=16)
    """
    if isinstance(address, str) and address.startswith(WS_SCHEMES):
        return WebsocketPolicy(address, *args, **kwargs)
    return GrpcPolicy(address, *args, **kwargs)


class GrpcPolicy:
    """A policy a ``PolicyServer(protocol="grpc")`` serves: the server runs
    the agent step, the host loop everything else.

    Args:
      address: ``"host:port"``, ``"grpc://host:port"`` or
        ``"grpcs://host:port"`` (TLS), as the server printed.
      token: the server's token (default: the ``JAXMESH_TOKEN`` environment
        variable, if set).
      tls: None (plain, unless the address is ``grpcs://``), True (TLS with
        the system's roots), a root certificate PEM path, or
        ``grpc.ChannelCredentials``.
      connect_timeout: seconds to wait for the server at the run's start.
      max_message_bytes: the largest message either way.
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        tls: Any = None,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        self.address = parse_address(address)
        self.token = env_token(token)
        if tls is None and uses_tls(address):
            tls = True
        self.tls = tls
        self._credentials()  # a bad tls= fails here, not in the run
        self.connect_timeout = check_seconds("connect_timeout", connect_timeout)
        self.max_message_bytes = max_message_bytes
        self.name = f"remote:{self.address}"

    def _credentials(self) -> Any:
        tls = self.tls
        if tls is None or tls is False:
            return None
        if tls is True:
            return grpc.ssl_channel_credentials()
        if isinstance(tls, grpc.ChannelCredentials):
            return tls
        if isinstance(tls, str | os.PathLike):
            try:
                with open(tls, "rb") as f:
                    return grpc.ssl_channel_credentials(root_certificates=f.read())
            except OSError as e:
                raise ValueError(
                    f"tls={tls!r}: cannot read the root certificate ({e}); expected "
                    "a PEM file, True (the system's roots) or grpc.ChannelCredentials"
                ) from e
        raise TypeError(
            f"tls={tls!r}: expected None, True, a root certificate PEM path or "
            "grpc.ChannelCredentials"
        )

    def as_policy(self, *, with_params: bool) -> Policy:
        """The engine's view; the host loop asks ``remote_agent`` for steps."""
        if with_params:
            raise TypeError(
                f"evaluate(params=...) with {self.name}: the params live on the "
                "policy server; serve the model with the params you want"
            )
        return Policy(name=self.name, apply=_refuse_apply)

    def remote_agent(self, pol: Policy, spec: Any, settings: Any, tile_lanes: Any):
        """The agent side of one run (``driver.HostAgent``'s part)."""
        return RemoteAgent(self, pol, spec, settings, tile_lanes)

    def __repr__(self) -> str:
        return f"GrpcPolicy({self.address!r})"


class _Stream:
    """One ``Session`` stream: ``call(message) -> reply`` in turn."""

    def __init__(self, remote: GrpcPolicy):
        self.address = remote.address
        creds = remote._credentials()
        self.channel = open_channel(self.address, creds, remote.max_message_bytes)
        try:
            grpc.channel_ready_future(self.channel).result(
                timeout=remote.connect_timeout
            )
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise RemoteConnectionError(
                f"no policy server answers at {self.address} (waited "
                f"{remote.connect_timeout:g} s): start one there (`jaxmesh "
                "serve-policy MODEL --protocol grpc --address "
                f"{self.address}`), or check the address"
                + (" and TLS" if creds is not None else ""),
                address=self.address,
                code="UNAVAILABLE",
            ) from None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        token = remote.token
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        call = self.channel.stream_stream(METHOD)
        self._replies = call(iter(self._queue.get, _END), metadata=metadata)
        #: Whether a reply has come (before it, a failure is not "mid-run").
        self.opened = False

    def call(self, message: dict) -> Any:
        self._queue.put(codec.packb(message))
        try:
            data = next(self._replies)
        except grpc.RpcError as e:
            raise self._error(e) from None
        except StopIteration:
            raise RemoteConnectionError(
                f"the policy server at {self.address} ended the session",
                address=self.address,
            ) from None
        self.opened = True
        return codec.unpackb(data)

    def _error(self, e: Any) -> Exception:
        code, details = e.code(), e.details() or ""
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ValueError(f"the policy server at {self.address} refused: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            why = f"refused the session: {details}"
        elif not self.opened:
            why = (
                f"failed to open the session ({code.name}: {details}); nothing has "
                "run: check the server's log, and that its model fits this env"
            )
        else:
            why = (
                f"went away mid-run ({code.name}: {details}); every finished "
                "episode is on exc.partial_result: start the server again and "
                "pass jaxmesh.evaluate(..., resume=exc.partial_result) to run the "
                "rest"
            )
        return RemoteConnectionError(
            f"the policy server at {self.address} {why}",
            address=self.address,
            code=code.name,
        )

    def close(self) -> None:
        self._queue.put(_END)
        with contextlib.suppress(Exception):  # the session is over either way
            for _ in self._replies:
                pass
        self.channel.close()


@dataclasses.dataclass(eq=False)
class RemoteState:
    """What the host loop reads of the agent state, as the server sent it."""

    cursor: np.ndarray
    chunk: np.ndarray
    pending: np.ndarray
    predict_calls: np.ndarray
    rows: int

    def read_back(self, *arrays: Any) -> tuple:
        return arrays


class RemoteStep:
    """``PackedStep``'s call, run on the server."""

    def __init__(self, stream: _Stream, n: int, layout: Any, reads: list[str]):
        self.stream, self.n = stream, n
        # Only the leaves the served policy reads are sent, in its order.
        names = jax.tree.leaves(layout.build({k: k for k in layout.names}))
        missing = sorted(set(reads) - set(names))
        if missing:
            raise ValueError(
                f"the policy server reads observation leaves {missing}, which "
                f"this env's observation (leaves {list(names)}) lacks"
            )
        self.picked = [names.index(k) for k in reads]

    keys_on_device = staticmethod(np.array)  # a copy of the keys, on the host

    def __call__(
        self,
        params,
        state,
        obs,
        started,
        active,
        ep_keys,
        t,
        moved=None,
        skip=None,
        texts=None,
        episodes=None,
    ):
        moved = np.ones(self.n, bool) if moved is None else np.asarray(moved, bool)
        every, rows = jax.tree.leaves(obs), slice(None) if moved.all() else moved
        leaves = [np.asarray(every[i])[rows] for i in self.picked]
        body = {
            "obs": leaves,
            "started": np.asarray(started, bool),
            "active": np.asarray(active, bool),
            "moved": moved,
            "keys": np.asarray(ep_keys),
            "t": np.asarray(t, np.int32),
        }
        if skip is not None:
            body["skip"] = np.asarray(skip, np.int32)
        reply = self.stream.call({"step": body})["step"]
        new = RemoteState(
            np.asarray(reply["cursor"]),
            np.asarray(reply["chunk"]),
            np.asarray(reply.get("pending", reply["chunk"])),
            np.asarray(reply["predict_calls"]),
            state.rows + int(reply["rows"]),
        )
        return new, np.asarray(reply["actions"])


class RemoteAgent:
    """``driver.HostAgent`` for a ``GrpcPolicy``: the session opens on the
    first ``program`` (before the run's hooks hear of it)."""

    def __init__(self, remote: GrpcPolicy, pol: Policy, spec, settings, tile_lanes):
        if settings.grid is not None or settings.execution is not None:
            what = "a sweep" if settings.grid is not None else "execution="
            raise ValueError(
                f"{remote.name}: {what} is not served yet; run the model in process"
            )
        self.remote, self.policy, self.spec = remote, pol, spec
        self.settings, self.tile_lanes = settings, tile_lanes
        self._stream: _Stream | None = None
        self._program: _HostProgram | None = None
        self.info: dict = {}

    def program(self, params: Any) -> _HostProgram:
        if self._program is not None:
            return self._program
        s = self.settings
        settings = {k: getattr(s, k) for k in SETTINGS if k != "tile_lanes"}
        settings["tile_lanes"] = self.tile_lanes
        stream = _Stream(self.remote)
        try:
            msg = {"open": {"env": spec_to_wire(self.spec), "settings": settings}}
            info = stream.call(msg)["opened"]
        except BaseException:
            stream.close()
            raise
        self._stream, self.info = stream, info
        spec = self.spec
        n, h = s.num_envs, int(info["horizon"])
        chunk = info["chunk"]
        cfg = agent.AgentConfig(
            num_envs=n,
            h=h,
            lead=int(info["lead"]),
            tile=int(info["tile"]),
            action_shape=tuple(spec.action_shape),
            action_dtype=spec.action_dtype,
            # A stand-in for the served inputs (what can_skip and a pace read).
            spec=(
                ("served", adapt.State(stack=1 if info["can_skip"] or h == 1 else 2)),
            ),
            raw=False,
            chunked=chunk is not None,
            delay=s.delay,
            chunk_len=1 if chunk is None else int(chunk),
        )

        def init(obs: Any, lanes: Any) -> RemoteState:
            chunks = np.zeros((n, h, *cfg.action_shape), cfg.action_dtype)
            zeros = np.zeros(n, np.int32)
            return RemoteState(zeros.copy(), chunks, chunks.copy(), zeros.copy(), 0)

        step = RemoteStep(stream, n, spec.layout, list(info["leaves"]))
        self._program = _HostProgram(cfg, chunk, init, step, None, spec.layout)
        return self._program

    def compile(self, params: Any) -> float:
        """The server compiled the step when the session opened."""
        return 0.0

    def digest(self) -> str:
        """The served policy's program digest (the server's probe)."""
        return str(self.info.get("digest", ""))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


__all__ = ["GrpcPolicy", "RemoteAgent", "RemotePolicy", "RemoteState"]
