"""What a server is told and where it listens: ``ServeOptions``, the request
size limit and the bind address (imports no other module of this package).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from typing import Any

from jaxmesh.remote import codec
from jaxmesh.remote.address import host_port
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import MAX_MESSAGE_BYTES

#: The full name of the gRPC service (also a health-check service name).
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvService"].full_name

_LOOPBACK_NAMES = ("localhost",)


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """How an :class:`EnvServer` serves.

    Attributes:
        idle_timeout_seconds: a session with no request for this long, or
            whose client takes no reply for this long, is ended
            (DEADLINE_EXCEEDED) and the server is free for the next client.
        drain_timeout_seconds: at shutdown, how long the call in progress may
            take to finish and reply before its stream is cancelled.
        close_timeout_seconds: at shutdown, how long to wait for the session to
            let go of the envs, and then for closing the envs the server made.
        allow_remote_shutdown: whether the ``Shutdown`` RPC may stop the server
            (else it is refused with PERMISSION_DENIED).
        token: when set, every call must carry the metadata ``authorization:
            Bearer <token>`` (clients: ``token=`` or ``JAXMESH_TOKEN``).
        workers: for ``"gymnasium:<id>"``, worker processes that build and
            step the lanes, each a contiguous group; for envs given as
            objects, threads (None: 1, the serving thread; docs/remote.md).
        max_message_bytes: the largest message either way; a reply over it is
            refused with RESOURCE_EXHAUSTED naming its size.
        max_request_bytes: the largest request the server receives (gRPC's
            receive limit, for every call, authenticated or not); None: a
            step request replaying ``REQUEST_STEPS`` actions on every lane, at
            least ``codec.MAX_HANDSHAKE_BYTES``, at most ``max_message_bytes``
            (``request_limit``).
        shared_memory: offer clients on this host, running as this user, the
            same-host data path (docs/remote.md).
        handshake_timeout_seconds: a same-host client has this long from
            connecting to a whole HELLO, and then to its ATTACHED; else its
            connection is closed.
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
        for name, low, strict in (
            ("idle_timeout_seconds", 0.0, True),
            ("handshake_timeout_seconds", 0.0, True),
            ("drain_timeout_seconds", 0.0, False),
            ("close_timeout_seconds", 0.0, False),
        ):
            value = getattr(self, name)
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and not math.isnan(value)
                and (value > low if strict else value >= low)
            )
            if not ok:
                bound = "> 0" if strict else ">= 0"
                raise ValueError(
                    f"ServeOptions({name}={value!r}): expected a number of seconds "
                    f"{bound} (math.inf for no limit)"
                )
        for name in ("shared_memory", "allow_remote_shutdown"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(
                    f"ServeOptions({name}={value!r}): expected True or False"
                )
        if self.token is not None and not header_token(self.token):
            raise ValueError(
                "ServeOptions(token=...): expected None or a non-empty string of "
                "printable ASCII without surrounding spaces (it travels as gRPC "
                "metadata); e.g. secrets.token_urlsafe(32)"
            )
        if self.workers is not None and not (
            isinstance(self.workers, int)
            and not isinstance(self.workers, bool)
            and self.workers >= 1
        ):
            raise ValueError(
                f"ServeOptions(workers={self.workers!r}): expected None or an int "
                ">= 1 (threads stepping groups of lanes)"
            )
        for name, default in (
            ("max_message_bytes", f"the default is {MAX_MESSAGE_BYTES}"),
            ("max_request_bytes", "None: sized from the lanes and the action"),
        ):
            value = getattr(self, name)
            if name == "max_request_bytes" and value is None:
                continue
            if not (
                isinstance(value, int)
                and not isinstance(value, bool)
                and 1024 <= value <= 2**31 - 1
            ):
                raise ValueError(
                    f"ServeOptions({name}={value!r}): expected an int in "
                    f"[1024, {2**31 - 1}] (gRPC's own ceiling); {default}"
                )


#: Actions per lane one step request may carry under the default receive limit
#: (a chunk of up to this many steps on every lane).
REQUEST_STEPS = 1024


def request_limit(options: ServeOptions, num_lanes: int, action_size: int) -> int:
    """The largest request the server accepts, in bytes: ``max_request_bytes``,
    else room for ``REQUEST_STEPS`` actions of ``action_size`` elements (at 8
    bytes each, with 64 bytes of framing a step) on each of ``num_lanes``
    lanes, at least a handshake's cap, never above ``max_message_bytes``."""
    if options.max_request_bytes is not None:
        return min(options.max_request_bytes, options.max_message_bytes)
    per_lane = REQUEST_STEPS * (8 * max(action_size, 1) + 64)
    wanted = max(codec.MAX_HANDSHAKE_BYTES, num_lanes * per_lane)
    return min(wanted, options.max_message_bytes)


def header_token(token: Any) -> bool:
    """Whether ``token`` can travel in a header: a non-empty string of
    printable ASCII without surrounding spaces."""
    return (
        isinstance(token, str)
        and token.isascii()
        and token.isprintable()
        and token.strip() == token != ""
    )


def bind(server: Any, where: str, credentials: Any) -> int:
    """Binds a ``grpc.Server`` to ``where`` (TLS with ``credentials``, else
    plain); the port bound.

    Raises:
      OSError: the address cannot be bound.
    """
    failed = None
    try:
        if credentials is not None:
            port = server.add_secure_port(where, credentials)
        else:
            port = server.add_insecure_port(where)
    except RuntimeError as exc:
        port, failed = 0, exc
    if not port:
        why = f" ({failed})" if failed else ""
        raise OSError(
            f"cannot bind {where!r}{why}; is the port in use? Pick another port, "
            "or port 0 for a free one"
        ) from failed
    return port


def _split_address(address: Any) -> tuple[str, int]:
    """(host, port) of ``"host:port"`` / ``"[v6]:port"`` to listen on (port 0
    picks a free one, ``address.host_port``); ValueError otherwise."""
    pair = host_port(address, bind=True)
    if pair is not None:
        return pair
    raise ValueError(
        f"address {address!r} is not HOST:PORT; expected e.g. '127.0.0.1:5555', "
        "'[::1]:5555' or '0.0.0.0:0' (port 0 picks a free port)"
    )


def check_exposure(
    address: str, host: str, secured: bool, does: str, token: str, tls: str
) -> None:
    """Refuses (ValueError) a non-loopback ``address`` not ``secured`` by a
    token, TLS or ``insecure=True``; ``does``, ``token``, ``tls``: what anyone
    could do there, and how the caller's API sets a token and TLS."""
    if not (secured or _is_loopback(host)):
        raise ValueError(
            f"refusing to serve on {address!r} with no token and no TLS: anyone "
            f"who reaches it could {does}. Bind a loopback address "
            f"(127.0.0.1:PORT), set a token ({token}, --token or JAXMESH_TOKEN), "
            f"pass {tls}, or say insecure=True (--insecure) if the network is "
            "trusted"
        )


def _is_loopback(host: str) -> bool:
    bare = host[1:-1] if host.startswith("[") else host
    if bare.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False
