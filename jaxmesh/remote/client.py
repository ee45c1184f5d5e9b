"""A client session with a jaxmesh env server: a handshake, then one Step
stream (the only place the client side touches gRPC). Every gRPC failure
becomes a ``jaxmesh.RemoteError`` naming the address (docs/remote.md).
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc

from jaxmesh._version import __version__
from jaxmesh.envs import timing
from jaxmesh.errors import RemoteConnectionError, RemoteEnvError, RemoteError
from jaxmesh.remote import codec
from jaxmesh.remote.address import parse_address, uses_tls
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.proto import jaxmesh_env_pb2_grpc as pb_grpc
from jaxmesh.remote.protocol import (
    ENV_ERROR_KEY,
    ENV_LANE_KEY,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSIONS,
    TOKEN_ENV,
    TRACEBACK_KEY,
)

DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds between keepalive pings (a dead server is found without a call).
KEEPALIVE_SECONDS = 10.0
#: ``Connection.close`` waits this long in all for the server to end the
#: session, and this long for each reply before it takes the server for hung.
CLOSE_TIMEOUT_SECONDS = 5.0
CLOSE_GRACE_SECONDS = 0.5


def open_channel(
    address: str, credentials: grpc.ChannelCredentials | None, max_message_bytes: int
) -> grpc.Channel:
    """A channel to ``address`` (TLS with ``credentials``, else plain)."""
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


def channel_tls(
    address: str, credentials: grpc.ChannelCredentials | None
) -> grpc.ChannelCredentials | None:
    """The TLS credentials a channel to ``address`` uses (None: plain)."""
    if credentials is not None and not isinstance(credentials, grpc.ChannelCredentials):
        raise TypeError(
            f"credentials is a {type(credentials).__name__}; expected "
            "grpc.ChannelCredentials (e.g. grpc.ssl_channel_credentials(...)) or None"
        )
    if uses_tls(address):
        return credentials or grpc.ssl_channel_credentials()
    if credentials is not None:
        raise ValueError(
            f"TLS credentials were given for {address!r}, a plain (grpc://) "
            "address; write it as 'grpcs://host:port' to connect over TLS, or "
            "drop credentials="
        )
    return None


def remote_error(exc: grpc.RpcError, address: str) -> RemoteError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    has = hasattr(exc, "trailing_metadata")
    trailing = dict(exc.trailing_metadata() or ()) if has else {}
    return status_error(code, details, trailing, address)


def status_error(
    code: grpc.StatusCode | None, details: str, trailing: dict, address: str
) -> RemoteError:
    """A call's end status and trailing metadata as the ``RemoteError`` that
    says what happened and what to do."""
    name = code.name if code is not None else None
    env_error = trailing.get(ENV_ERROR_KEY)
    if env_error is not None:
        tb = trailing.get(TRACEBACK_KEY, b"")
        tb = tb.decode("utf-8", "replace") if isinstance(tb, bytes) else str(tb)
        lane, phase, steps = None, None, 0
        with contextlib.suppress(ValueError):  # "<lane> <phase> <steps>"
            j, p, k = str(trailing.get(ENV_LANE_KEY)).split(" ")
            if p in ("resetting", "stepping"):
                lane, phase, steps = int(j), p, int(k)
        return RemoteEnvError(
            f"the env served at {address} raised {env_error} ({details}); its "
            f"traceback on the server:\n{tb}",
            address=address,
            remote_traceback=tb,
            lane=lane,
            phase=phase,
            steps_done=steps,
            summary=str(env_error),
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        if "tls handshake" in details.lower() or "certificate" in details.lower():
            hint = (
                "the TLS handshake failed: give credentials="
                "grpc.ssl_channel_credentials(root_certificates=...) holding the "
                "certificate (or CA) the server uses, and connect by a host name "
                "the certificate names"
            )
        else:
            hint = (
                "check the address and that the server (`jaxmesh serve-env` or "
                "EnvServer.start()) is running there; a server started with TLS "
                "(--tls-cert) is reached at grpcs://host:port"
            )
        return RemoteConnectionError(
            f"the jaxmesh env server at {address} is unavailable ({details}); " + hint,
            address=address,
            code=name,
        )
    if code in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.CANCELLED,
    ):
        return RemoteConnectionError(
            f"the jaxmesh env server at {address} ended the call: {name}: {details}",
            address=address,
            code=name,
        )
    return RemoteError(
        f"the jaxmesh env server at {address} failed the call: {name}: {details}",
        address=address,
        code=name,
    )


def next_reply(
    replies: queue.Queue,
    reply_timeout: float | None,
    address: str,
    on_timeout: Callable[[], None],
) -> Any:
    """The next ``(_, item)`` in ``replies``; an exception is raised and put
    back; none in ``reply_timeout``: ``on_timeout()`` and RemoteConnectionError."""
    try:
        _, item = replies.get(timeout=reply_timeout)
    except queue.Empty:
        on_timeout()
        raise RemoteConnectionError(
            f"no reply from the jaxmesh env server at {address} within "
            f"{reply_timeout} s (reply_timeout); the env may hang",
            address=address,
            code="DEADLINE_EXCEEDED",
        ) from None
    if isinstance(item, BaseException):
        replies.put((None, item))
        raise item
    return item


class Stream:
    """How a session's calls and replies travel (``Connection``: the gRPC Step
    stream, ``shm.ShmStream``: the same-host path): ``open``, ``send(call)``
    (its size in bytes), ``receive``, ``owed_since``, ``close``. A subclass
    sets ``kind``, ``address``, ``reply_timeout``, ``send``, ``close``,
    ``_begin`` (opens the stream) and ``_next`` (a reply, the exception met,
    or None at the end)."""

    kind: str
    address: str
    reply_timeout: float | None
    _next: Callable[[], Any]
    _begin: Callable[[], None]
    _stream: Any = None  # None until open

    def _start_stream(self) -> None:
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self._early: collections.deque = collections.deque()  # read by the caller
        self._reader: threading.Thread | None = None
        self._progress = self._last_send = time.monotonic()
        self.sent_at = 0.0  # perf_counter() when the last request was handed over
        self._sent = 0
        self._owed: collections.deque = collections.deque()  # each unanswered send
        self._broken = False  # a reply timed out or the stream failed

    def _sending(self) -> None:
        self.sent_at = time.perf_counter()  # the server can start from here on
        self._sent += 1
        self._last_send = time.monotonic()
        self._owed.append(self._last_send)

    def owed_since(self) -> float | None:
        """Since when (monotonic) the server owes a reply and sent nothing;
        None: it owes none."""
        return max(self._progress, self._owed[0]) if self._owed else None

    def open(
        self,
        encode: Callable[[Any], pb.StepRequest],
        decode: Callable[[pb.StepReply, bool], Any],
        *,
        replies: queue.SimpleQueue | None = None,
        tag: Any = None,
        reader: bool = True,
    ) -> None:
        """Opens the stream (``encode``: a call's ``StepRequest``;
        ``decode(reply, in_ring)``: its batch; the rest as ``Session.open``'s)."""
        self._encode, self._decode = encode, decode
        self._begin()
        if reader:
            sink = self._replies if replies is None else replies
            self._reader = self._drain_thread(
                lambda item: sink.put((tag, item)), f"jaxmesh-{self.kind}-reader"
            )

    def receive(self) -> tuple[pb.StepReply, Any, float, float]:
        """The next ``(reply, decoded, arrived, decoded_at)`` (perf_counter
        times); RemoteError: the call failed, or no reply in ``reply_timeout``."""
        if self._reader is not None or self._stream is None:
            return next_reply(
                self._replies, self.reply_timeout, self.address, self._hangs
            )
        item = self._early.popleft() if self._early else self._next()
        if item is None:
            item = RemoteConnectionError(
                f"the session with {self.address} is closed", address=self.address
            )
        if isinstance(item, BaseException):
            self._early.appendleft(item)  # every later receive raises it too
            raise item
        return item

    def _await_end(self, since: float, timeout: float, grace: float) -> None:
        """Waits for the reader (a thread taking a closing stream's last replies
        when none runs) while the server answers: until nothing came for
        ``grace`` s after ``since`` or the last reply, the stream breaks, or
        ``timeout`` s in all."""
        reader = self._reader or self._drain_thread()
        deadline = time.monotonic() + timeout
        while reader.is_alive() and not self._broken:
            left = min(deadline, max(self._progress, since) + grace) - time.monotonic()
            if left <= 0:
                return
            reader.join(left)

    def _closed(self) -> RemoteConnectionError:
        what = f"the jaxmesh env server at {self.address} closed the session"
        return RemoteConnectionError(what, address=self.address)

    def _hangs(self) -> None:  # no reply in time: close() will not wait
        self._broken = True

    def _drain_thread(self, put: Callable | None = None, name: str | None = None):
        """A thread reading the replies until the end or an exception into
        ``put`` (None: a closing stream's last ones discarded)."""

        def run() -> None:
            while (item := self._next()) is not None:
                if put is not None:
                    put(item)
                if isinstance(item, BaseException):
                    return

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread


class ServerInfo(NamedTuple):
    address: str
    env_name: str
    observation: tuple[pb.LeafSpec, ...]  # in the declared order
    action: pb.LeafSpec
    num_lanes: int
    reset_options: dict[str, pb.Value]
    capabilities: tuple[str, ...]
    dt: float | None = None  # simulated seconds per env step
    shared_memory: str = ""  # the same-host path's socket ("": none offered)


_END = object()  # ends the requests of a Step stream


class Connection(Stream):
    """The gRPC ``Stream``: the handshake at construction (``info``;
    the arguments as ``jaxmesh.RemoteEnv``'s), then ``open``, ``send``,
    ``receive``. Raises ValueError or TypeError (bad arguments) and
    ``jaxmesh.RemoteConnectionError`` (unreachable, refused, no common version).
    """

    kind = "grpc"

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        reply_timeout: float | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        credentials: grpc.ChannelCredentials | None = None,
    ):
        self.address = parse_address(address)
        credentials = channel_tls(address, credentials)
        where = "token=" if token is not None else TOKEN_ENV
        token = os.environ.get(TOKEN_ENV) if token is None else token
        if token and token.strip() != token:
            raise ValueError(
                f"{where} has spaces or a line break around it; a server's token "
                "has none, and tokens are compared exactly: strip it (e.g. a "
                "token read from a file keeps its newline)"
            )
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.token = token or None  # for the same-host data path
        self.connect_timeout, self.reply_timeout = connect_timeout, reply_timeout
        self.max_message_bytes = max_message_bytes
        self._channel = open_channel(self.address, credentials, max_message_bytes)
        self._stub = pb_grpc.EnvServiceStub(self._channel)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._start_stream()
        request = pb.HandshakeRequest(
            protocol_versions=PROTOCOL_VERSIONS,
            client_version=f"jaxmesh {__version__}",
            token=token or "",
        )
        try:
            reply = self._stub.Handshake(
                request,
                timeout=connect_timeout,
                metadata=self._metadata,
                wait_for_ready=False,
            )
        except grpc.RpcError as exc:
            self._channel.close()
            raise remote_error(exc, self.address) from None
        why = None
        if reply.protocol_version not in PROTOCOL_VERSIONS:
            why = (
                f"chose protocol version {reply.protocol_version}; this client "
                f"speaks {list(PROTOCOL_VERSIONS)}: upgrade the older side"
            )
        elif (
            not 1 <= len(reply.observation) <= codec.MAX_KEYS or len(reply.action) != 1
        ):
            why = (
                f"declares {len(reply.observation)} observation and "
                f"{len(reply.action)} action leaves; this client reads 1 to "
                f"{codec.MAX_KEYS} observation leaves and exactly one action leaf"
            )
        if why is not None:
            self._channel.close()
            raise RemoteConnectionError(
                f"the server at {self.address} {why}", address=self.address
            )
        self.info = ServerInfo(
            address=self.address,
            env_name=reply.env_name or f"grpc://{self.address}",
            observation=tuple(reply.observation),
            action=reply.action[0],
            num_lanes=int(reply.num_lanes),
            reset_options={o.name: o.value for o in reply.reset_options},
            capabilities=tuple(reply.capabilities),
            dt=timing.seconds(reply.dt),
            shared_memory=reply.shared_memory,
        )

    def _begin(self) -> None:
        if self._stream is not None:
            raise RuntimeError(f"the session with {self.address} is already open")
        outgoing = iter(self._requests.get, _END)
        self._stream = self._stub.Step(outgoing, metadata=self._metadata)
        self._progress = time.monotonic()
        self._replies_in = iter(self._stream)

    def _next(self) -> Any:
        try:
            reply = next(self._replies_in)
        except (StopIteration, grpc.RpcError) as exc:
            self._progress = time.monotonic()
            if self._stream is None:  # our own close(): the server ended it
                return None
            self._broken = True
            if isinstance(exc, grpc.RpcError):
                return remote_error(exc, self.address)
            return self._closed()
        self._progress = time.monotonic()
        if self._owed:
            self._owed.popleft()
        arrived = time.perf_counter()
        try:
            decoded = self._decode(reply, False)
        except BaseException as exc:  # handed to the caller in order
            return exc
        return reply, decoded, arrived, time.perf_counter()

    def send(self, call: Any) -> int:
        """Queues a call's request (never waits); its size in bytes
        (ProtocolError: over the message cap)."""
        # The request belongs to gRPC once queued: nothing may change it after.
        request = self._encode(call)
        size = request.ByteSize()
        codec.check_size(size, self.max_message_bytes, "step request")
        self._sending()
        self._requests.put(request)
        return size

    def close(
        self,
        timeout: float = CLOSE_TIMEOUT_SECONDS,
        grace: float = CLOSE_GRACE_SECONDS,
    ) -> None:
        """Ends the session and closes the channel (idempotent), awaiting the
        server's end while it answers (``_await_end``)."""
        stream = self._stream
        if stream is not None:
            self._requests.put(_END)
            self._stream = None
            # A reader thread read replies as they came: quiet since the last.
            owed = self._reader is not None and self._owed
            since = max(self._progress, self._last_send) if owed else time.monotonic()
            if self._reader is not None or not self._broken:
                self._await_end(since, timeout, grace)
            stream.cancel()
        self._channel.close()
