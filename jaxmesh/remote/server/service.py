"""``EnvServer``: its lifecycle and its gRPC service (docs/remote.md)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hmac
import math
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from jaxmesh._version import __version__
from jaxmesh.envs.gymnasium.lanes import closing_on_error
from jaxmesh.remote import codec
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import (
    CAPABILITIES,
    LOCKSTEP,
    PROTOCOL_VERSIONS,
    SHARED_MEMORY,
    TOKEN_ENV,
)
from jaxmesh.remote.server.lanes import ServerStepper, _make_lanes
from jaxmesh.remote.server.options import (
    SERVICE_NAME,
    ServeOptions,
    grpc_server,
    listen_address,
    request_limit,
)
from jaxmesh.remote.server.requests import _parse_request
from jaxmesh.remote.server.same_host import SameHostPath
from jaxmesh.remote.server.sessions import (
    CallError,
    _cancel,
    _Session,
    check_reply,
    idle_message,
    run_call,
    step_reply,
)


class EnvServer:
    """Serves a gymnasium env's lanes over gRPC (the ``jaxmesh.env.v1`` protocol).

    Args:
        env: a gymnasium ``Env`` (one lane), a list of distinct Envs with equal
            spaces, a ``VectorEnv`` in ``AutoresetMode.DISABLED``,
            ``"gymnasium:<id>"``, or a zero-argument factory of one of these
            (called in :meth:`start`). What the server makes it closes.
        address: ``"host:port"`` to bind (port 0: a free one). A non-loopback
            host needs a token, TLS ``credentials`` or ``insecure=True``.
        options: :class:`ServeOptions` (default: ``ServeOptions()``).
        lanes: how many envs to make for ``"gymnasium:<id>"`` (default 1).
        insecure: allow a non-loopback host with no token and no TLS.
        credentials: ``grpc.ServerCredentials`` to serve over TLS.

    Raises:
        ValueError: a bad or unsecured address, bad ``lanes``.
        TypeError: bad ``options`` or ``credentials``.

    Example:
        >>> with EnvServer("gymnasium:CartPole-v1", lanes=8) as server:
        ...     print(server.address)  # doctest: +SKIP
        127.0.0.1:40123
    """

    def __init__(
        self,
        env: Any,
        address: str = "127.0.0.1:0",
        *,
        options: ServeOptions | None = None,
        lanes: int | None = None,
        insecure: bool = False,
        credentials: grpc.ServerCredentials | None = None,
    ):
        options = ServeOptions() if options is None else options
        if not isinstance(options, ServeOptions):
            raise TypeError(
                f"options is a {type(options).__name__}; expected "
                "jaxmesh.ServeOptions(...) or None"
            )
        if lanes is not None and not (
            isinstance(lanes, int) and not isinstance(lanes, bool) and lanes >= 1
        ):
            raise ValueError(f"lanes={lanes!r}: expected None or an int >= 1")
        if credentials is not None and not isinstance(
            credentials, grpc.ServerCredentials
        ):
            raise TypeError(
                f"credentials is a {type(credentials).__name__}; expected "
                "grpc.ServerCredentials (e.g. grpc.ssl_server_credentials(...)) or "
                "None"
            )
        secured = options.token is not None or credentials is not None or insecure
        token_arg, tls_arg = "ServeOptions(token=...)", "TLS credentials="
        host, port = listen_address(
            address, secured, "drive the env", token_arg, tls_arg
        )
        self._env = env
        self._host, self._port = host, port
        self._address = address  # the bound one once started
        self.options = options
        self._lanes_wanted = lanes
        self._credentials = credentials
        self._lanes: ServerStepper | None = None
        self._server: grpc.Server | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._health: health.HealthServicer | None = None
        self._state_lock = threading.Lock()
        self._session_lock = threading.Lock()
        self._session: _Session | None = None
        self._stopping = False
        self._stopped = threading.Event()
        self._handshake: pb.HandshakeReply | None = None
        self._same_host: SameHostPath | None = None

    @property
    def address(self) -> str:
        """The bound ``"host:port"`` (the actual port once started)."""
        return self._address

    @property
    def num_lanes(self) -> int:
        """The number of lanes served (after :meth:`start`)."""
        if self._lanes is None:
            raise RuntimeError("the server has not started; call start() first")
        return self._lanes.num_lanes

    def start(self) -> EnvServer:
        """Builds the lanes, binds, and serves in background threads.

        Returns:
            self, serving (``address`` holds the actual port).

        Raises:
            RuntimeError: started twice.
            OSError: the address cannot be bound.
            ValueError, TypeError: an env the server cannot serve.
        """
        with self._state_lock:
            if self._server is not None or self._stopping:
                raise RuntimeError(
                    f"EnvServer at {self.address} was already started; make a new "
                    "EnvServer to serve again"
                )
            lanes = _make_lanes(
                self._env, self._lanes_wanted, self.options.workers or 1
            )
            with closing_on_error([lanes]):
                self._start_server(lanes)
            self._lanes = lanes
        return self

    def _start_server(self, lanes: ServerStepper) -> None:
        limit = self.options.max_message_bytes
        action_size = math.prod(lanes.act_leaf.shape)
        receive = request_limit(self.options, lanes.num_lanes, action_size)
        handlers = {
            "Handshake": grpc.unary_unary_rpc_method_handler(self._handshake_rpc),
            "Step": grpc.stream_stream_rpc_method_handler(self._step_rpc),
            "Shutdown": grpc.unary_unary_rpc_method_handler(self._shutdown_rpc),
        }
        server, self._executor, port = grpc_server(
            f"{self._host}:{self._port}",
            self._credentials,
            SERVICE_NAME,
            handlers,
            workers=16,
            name="jaxmesh-serve",
            why=self._token_error if self.options.token else None,
            send=limit,
            receive=receive,
            # Receive windows stay at 64 KiB: all a refused client can
            # make the server hold.
            extra=(("grpc.http2.bdp_probe", 0),),
        )
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self._address = f"{self._host}:{port}"
        if self.options.shared_memory and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):  # no same-host path then
                self._same_host = SameHostPath(self)
        shm_name = self._same_host.name if self._same_host is not None else ""
        self._handshake = pb.HandshakeReply(
            server_protocol_versions=PROTOCOL_VERSIONS,
            server_version=f"jaxmesh {__version__}",
            observation=lanes.obs_leaves,
            action=[lanes.act_leaf],
            num_lanes=lanes.num_lanes,
            reset_options=[
                pb.ResetOption(name=name, value=pb.Value(int_value=0))
                for name in lanes.reset_options
            ],
            capabilities=CAPABILITIES
            + ((LOCKSTEP,) if lanes.lockstep else ())
            + ((SHARED_MEMORY,) if shm_name else ()),
            env_name=lanes.name,
            dt=lanes.lanes.dt or 0.0,
            shared_memory=shm_name,
        )
        server.start()
        self._server = server
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def serve(self) -> None:
        """Starts (if needed) and blocks until shut down (also by Ctrl-C)."""
        if self._server is None:
            self.start()
        try:
            while not self._stopped.wait(1.0):
                pass
        except KeyboardInterrupt:
            self.shutdown()

    def shutdown(self) -> None:
        """Stops serving (idempotent): health NOT_SERVING, the session drained
        (``drain_timeout_seconds``, then a worker's call is killed), the envs
        the server made closed (``close_timeout_seconds``)."""
        with self._state_lock:
            if self._stopping or self._server is None:
                self._stopping = True
                if self._server is None:
                    self._stopped.set()
                return
            self._stopping = True
        self._health.enter_graceful_shutdown()
        session = self._session
        if session is not None:
            session.end(
                grpc.StatusCode.UNAVAILABLE,
                f"the server at {self.address} is shutting down; the session ended",
            )
        opts = self.options
        done = self._server.stop(opts.drain_timeout_seconds)
        if self._session_lock.acquire(timeout=opts.drain_timeout_seconds):
            self._session_lock.release()
        else:  # the call outlived its grace: a hung env's worker is killed
            self._lanes.lanes.abandon(respawn=False)
        done.wait(opts.drain_timeout_seconds + opts.close_timeout_seconds)
        if self._same_host is not None:
            self._same_host.stop()
        late = None
        if self._session_lock.acquire(timeout=opts.close_timeout_seconds):
            closer = threading.Thread(target=self._lanes.close, daemon=True)
            try:
                closer.start()
                closer.join(opts.close_timeout_seconds)
            finally:
                self._session_lock.release()
            if closer.is_alive():
                late = "closing the envs took more than {}; left them closing"
        else:
            late = "the session still held the envs after {}; they were not closed"
        if late is not None:
            seconds = f"close_timeout_seconds={opts.close_timeout_seconds}"
            warnings.warn(
                f"EnvServer at {self.address}: {late.format(seconds)}",
                RuntimeWarning,
                stacklevel=2,
            )
        # Idle handler threads exit now (a call still running ends first).
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until shut down (or ``timeout``); whether it has stopped."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> EnvServer:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "serving" if self._server is not None else "not started"
        state = "stopped" if self._stopped.is_set() else state
        return f"EnvServer({self.address}, {state})"

    def _token_error(self, metadata: Any, given: str | None = None) -> str | None:
        """Why a call with this metadata (and handshake token) is refused."""
        token = self.options.token
        if token is None:
            return None
        sent = None
        for key, value in metadata or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, rest = value.partition(" ")
                if scheme.lower() == "bearer":
                    sent = rest
        if not sent:
            return (
                f"the server at {self.address} needs a session token and the call "
                "carried none as the metadata 'authorization: Bearer <token>'; pass "
                f"token= (RemoteEnv, RemoteVectorEnv, evaluate) or set {TOKEN_ENV}"
            )
        for value in (sent, given):
            if value and not hmac.compare_digest(value.encode(), token.encode()):
                return (
                    f"the session token given is not the one the server at "
                    f"{self.address} was started with (tokens are compared "
                    f"exactly, spaces included); pass the right token= or set "
                    f"{TOKEN_ENV}"
                )
        return None

    def _handshake_rpc(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        limit = self.options.max_message_bytes
        try:
            request = codec.parse_handshake_request(data, limit)
        except codec.ProtocolError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        # The interceptor checked the metadata of every call; this, the token sent.
        why = self._token_error(context.invocation_metadata(), request.token)
        if why is not None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        try:
            version = codec.choose_version(request.protocol_versions)
        except codec.ProtocolError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        reply = pb.HandshakeReply()
        reply.CopyFrom(self._handshake)
        reply.protocol_version = version
        return reply.SerializeToString()

    def _shutdown_rpc(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        if not self.options.allow_remote_shutdown:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the server at {self.address} does not allow remote shutdown; "
                "start it with ServeOptions(allow_remote_shutdown=True) "
                "(--allow-remote-shutdown), or stop it where it runs",
            )
        threading.Thread(
            target=self.shutdown, name="jaxmesh-remote-shutdown", daemon=True
        ).start()
        return pb.ShutdownReply().SerializeToString()

    def _step_rpc(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        refused = self._admit()
        if refused is not None:
            context.abort(*refused)
        lanes = self._lanes
        session = _Session(functools.partial(_cancel, context))
        idle = self.options.idle_timeout_seconds
        session.watch_idle(idle, functools.partial(idle_message, self.address, idle))
        self._session = session
        # The stream ends while a call runs (its client gave up or went away,
        # or shutdown's grace ran out): a hung env's worker is killed.
        context.add_callback(
            lambda: session.abandon(
                functools.partial(lanes.lanes.abandon, respawn=not self._stopping)
            )
        )
        limit = self.options.max_message_bytes

        def parse(data: bytes) -> Any:
            return _parse_request(codec.parse_step_request(data, limit), lanes)

        def answer(data: bytes) -> bytes:
            out = step_reply(*run_call(lanes.execute, parse, data))
            check_reply(len(out), limit)
            return out

        try:
            yield from session.serve(lambda: next(requests, None), answer)
        except CallError as exc:
            code, details, metadata = exc.args
            context.set_trailing_metadata(metadata)
            context.abort(code, details)
        finally:
            self._end_session(session)

    def _admit(self) -> tuple[grpc.StatusCode, str] | None:
        """Takes the one-session lock, else the status that refuses a session."""
        if self._stopping:
            return (
                grpc.StatusCode.UNAVAILABLE,
                f"the server at {self.address} is shutting down",
            )
        if not self._session_lock.acquire(blocking=False):
            return (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server at {self.address} is busy with another client's "
                "session (one session at a time); wait for it to end, or start "
                "another server for this client",
            )
        return None

    def _end_session(self, session: _Session) -> None:
        """Ends ``session`` and frees the server for the next one."""
        session.stop()
        self._lanes.end_session()
        self._session = None
        self._session_lock.release()
