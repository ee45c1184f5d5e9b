"""``ServeOptions``, the request size limit, the bind address and the gRPC
server both servers build."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any

import grpc

from jaxmesh.remote import codec
from jaxmesh.remote.address import host_port
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import MAX_MESSAGE_BYTES

#: The full name of the gRPC service (also a health-check service name).
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvService"].full_name


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """How an :class:`EnvServer` serves.

    Attributes:
        idle_timeout_seconds: a session with no request, or whose client takes
            no reply, for this long is ended (DEADLINE_EXCEEDED).
        drain_timeout_seconds: at shutdown, how long the call in progress may
            take before its stream is cancelled.
        close_timeout_seconds: at shutdown, how long to wait for the session to
            let go of the envs, and then for closing the envs the server made.
        allow_remote_shutdown: whether the ``Shutdown`` RPC may stop the server
            (else PERMISSION_DENIED).
        token: when set, every call must carry ``authorization: Bearer
            <token>`` (clients: ``token=`` or ``JAXMESH_TOKEN``).
        workers: worker processes stepping contiguous groups of the lanes of
            ``"gymnasium:<id>"``, threads for envs given as objects (None: 1).
        max_message_bytes: the largest message either way; a larger reply is
            refused with RESOURCE_EXHAUSTED.
        max_request_bytes: the largest request received, for every call
            (None: ``request_limit``'s, from the lanes and the action).
        shared_memory: offer the same-host data path (docs/remote.md).
        handshake_timeout_seconds: a same-host client has this long from
            connecting to a whole HELLO, and then to its ATTACHED.
    """

    idle_timeout_seconds: float = 300.0
    drain_timeout_seconds: float = 5.0
    close_timeout_seconds: float = 10.0
    allow_remote_shutdown: bool = False
    token: str | None = None
    workers: int | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_request_bytes: int | None = None
    shared_memory: bool = True
    handshake_timeout_seconds: float = 10.0

    def __post_init__(self):
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def seconds(v: Any) -> bool:
            return is_int(v) or isinstance(v, float)

        def size(v: Any) -> bool:
            return is_int(v) and 1024 <= v <= 2**31 - 1

        strict = "a number of seconds > 0 (math.inf for no limit)"
        loose = "a number of seconds >= 0 (math.inf for no limit)"
        ints = f"an int in [1024, {2**31 - 1}] (gRPC's own ceiling); "
        rules = (  # (field, is it fine, what is expected); TypeError: not a bool
            ("idle_timeout_seconds", lambda v: seconds(v) and v > 0, strict),
            ("handshake_timeout_seconds", lambda v: seconds(v) and v > 0, strict),
            ("drain_timeout_seconds", lambda v: seconds(v) and v >= 0, loose),
            ("close_timeout_seconds", lambda v: seconds(v) and v >= 0, loose),
            ("shared_memory", lambda v: isinstance(v, bool), None),
            ("allow_remote_shutdown", lambda v: isinstance(v, bool), None),
            (
                "workers",
                lambda v: v is None or (is_int(v) and v >= 1),
                "None or an int >= 1 (threads stepping groups of lanes)",
            ),
            ("max_message_bytes", size, f"{ints}the default is {MAX_MESSAGE_BYTES}"),
            (
                "max_request_bytes",
                lambda v: v is None or size(v),
                f"{ints}None: sized from the lanes and the action",
            ),
        )
        for name, ok, expected in rules:
            value = getattr(self, name)
            if not ok(value):
                error = ValueError if expected else TypeError
                raise error(
                    f"ServeOptions({name}={value!r}): expected "
                    f"{expected or 'True or False'}"
                )
        check_token(self.token, "ServeOptions(token=...)", "as gRPC metadata")


#: Actions per lane a step request may carry under the default receive limit.
REQUEST_STEPS = 1024


def request_limit(options: ServeOptions, num_lanes: int, action_size: int) -> int:
    """The largest request accepted: ``max_request_bytes``, else room for
    ``REQUEST_STEPS`` actions (8 bytes an element, 64 of framing) on every
    lane, at least a handshake's cap; at most ``max_message_bytes``."""
    if options.max_request_bytes is not None:
        return min(options.max_request_bytes, options.max_message_bytes)
    per_lane = REQUEST_STEPS * (8 * max(action_size, 1) + 64)
    wanted = max(codec.MAX_HANDSHAKE_BYTES, num_lanes * per_lane)
    return min(wanted, options.max_message_bytes)


def check_token(token: Any, name: str, travels: str) -> None:
    """ValueError (never saying the token) unless ``token`` is None or can
    travel ``travels`` (a header)."""
    if token is not None and not (
        isinstance(token, str)
        and token.isascii()
        and token.isprintable()
        and token.strip() == token != ""
    ):
        raise ValueError(
            f"{name}: expected None or a non-empty string of printable ASCII "
            f"without surrounding spaces (it travels {travels}); e.g. "
            "secrets.token_urlsafe(32)"
        )


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses a call to ``handlers`` that ``why(metadata)`` names a reason
    for before its message is read, so such a client holds no more than a
    flow-control window (calls to other services pass: Health)."""

    def __init__(self, service: str, handlers: dict, why: Callable):
        self.prefix, self.handlers, self.why = f"/{service}/", handlers, why

    def intercept_service(self, continuation, details):
        method, why = details.method, None
        if method.startswith(self.prefix):
            why = self.why(details.invocation_metadata)
        if why is None:
            return continuation(details)

        def refuse(requests: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        handler = self.handlers.get(method[len(self.prefix) :])
        if handler is not None and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        # Unary methods are answered as client-streaming ones: the request
        # iterator is never advanced, so the message is never received.
        return grpc.stream_unary_rpc_method_handler(refuse)


def grpc_server(
    where: str,
    credentials: Any,
    service: str,
    handlers: dict,
    *,
    workers: int,
    name: str,
    why: Callable | None,
    send: int,
    receive: int,
    extra: tuple = (),
    **kwargs: Any,
) -> tuple[grpc.Server, concurrent.futures.ThreadPoolExecutor, int]:
    """A ``grpc.Server`` serving ``handlers`` as ``service`` in ``workers``
    threads, bound to ``where`` (TLS with ``credentials``) and not started; its
    executor (``stop()`` leaves its threads idle) and port. ``why``: the token
    check (None: none); ``send``, ``receive``: the largest message each way;
    ``extra``: more channel options. OSError: cannot bind."""
    executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=name)
    server = grpc.server(
        executor,
        interceptors=() if why is None else (_TokenCheck(service, handlers, why),),
        options=[
            ("grpc.max_send_message_length", send),
            ("grpc.max_receive_message_length", receive),
            # Without this, Linux lets a second server bind a port in use.
            ("grpc.so_reuseport", 0),
            # Clients ping every 10 s; gRPC answers pings more often than
            # every 5 minutes with GOAWAY "too_many_pings" by default.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
            ("grpc.http2.max_ping_strikes", 0),
            *extra,
        ],
        **kwargs,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, handlers),)
    )
    failed = None
    try:
        if credentials is not None:
            port = server.add_secure_port(where, credentials)
        else:
            port = server.add_insecure_port(where)
    except RuntimeError as exc:
        port, failed = 0, exc
    if not port:
        executor.shutdown(wait=False)
        cause = f" ({failed})" if failed else ""
        raise OSError(
            f"cannot bind {where!r}{cause}; is the port in use? Pick another port, "
            "or port 0 for a free one"
        ) from failed
    return server, executor, port


def listen_address(
    address: Any, secured: bool, does: str, token: str, tls: str
) -> tuple[str, int]:
    """(host, port) to listen on. ValueError: not ``"host:port"``, or a
    non-loopback address not ``secured`` (``does``, ``token``, ``tls``: what
    anyone could do there, how to set a token and TLS)."""
    pair = host_port(address, bind=True)
    if pair is None:
        raise ValueError(
            f"address {address!r} is not HOST:PORT; expected e.g. '127.0.0.1:5555', "
            "'[::1]:5555' or '0.0.0.0:0' (port 0 picks a free port)"
        )
    bare = pair[0][1:-1] if pair[0].startswith("[") else pair[0]
    with contextlib.suppress(ValueError):
        secured = secured or ipaddress.ip_address(bare).is_loopback
    if not (secured or bare.lower() == "localhost"):
        raise ValueError(
            f"refusing to serve on {address!r} with no token and no TLS: anyone "
            f"who reaches it could {does}. Bind a loopback address "
            f"(127.0.0.1:PORT), set a token ({token}, --token or JAXMESH_TOKEN), "
            f"pass {tls}, or say insecure=True (--insecure) if the network is "
            "trusted"
        )
    return pair
