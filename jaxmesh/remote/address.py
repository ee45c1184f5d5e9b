"""Served-env addresses (``"grpc://host:port"``, ``"grpcs://"`` for TLS),
recognised without importing gRPC."""

from __future__ import annotations

from typing import Any

SCHEME = "grpc://"
TLS_SCHEME = "grpcs://"
SCHEMES = (SCHEME, TLS_SCHEME)
INSTALL = "pip install 'jaxmesh[remote]'"


def is_address(env: Any) -> bool:
    """Whether ``env`` names served envs: ``"grpc://host:port"`` (or
    ``"grpcs://host:port"``) or a list of them."""
    if isinstance(env, str):
        return env.startswith(SCHEMES)
    return (
        isinstance(env, list | tuple)
        and len(env) > 0
        and all(isinstance(e, str) and e.startswith(SCHEMES) for e in env)
    )


def uses_tls(address: str) -> bool:
    """Whether ``address`` asks for TLS (``"grpcs://host:port"``)."""
    return isinstance(address, str) and address.startswith(TLS_SCHEME)


def host_port(target: Any, *, bind: bool = False) -> tuple[str, int] | None:
    """``(host, port)`` of ``"host:port"`` or ``"[v6]:port"``; None when
    ``target`` is not one. The port is in 1..65535, or 0..65535 with ``bind``
    (port 0: the server picks a free one)."""
    if not isinstance(target, str):
        return None
    host, sep, port = target.rpartition(":")
    if not (sep and host and port.isdigit()):
        return None
    if host.startswith("[") ^ host.endswith("]"):
        return None
    if not (0 if bind else 1) <= int(port) <= 65535:
        return None
    return host, int(port)


def parse_address(address: Any) -> str:
    """``"grpc://host:port"``, ``"grpcs://host:port"`` or ``"host:port"`` as
    gRPC's ``"host:port"`` (TypeError: not a string; ValueError: malformed)."""
    if not isinstance(address, str):
        raise TypeError(f"address {address!r}: expected a string 'grpc://host:port'")
    target = address
    for scheme in SCHEMES:
        if address.startswith(scheme):
            target = address[len(scheme) :]
    if host_port(target) is None:
        raise ValueError(
            f"address {address!r} is not 'grpc://host:port' with a port in "
            "1..65535 (e.g. 'grpc://127.0.0.1:5555'); pass the address "
            "`jaxmesh serve-env` printed"
        )
    return target


def require_grpc() -> None:
    """Raises ImportError with the install line when the [remote] extra is missing."""
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"served envs need gRPC, which is not installed; run: {INSTALL}"
        ) from exc


__all__ = [
    "host_port",
    "INSTALL",
    "SCHEME",
    "SCHEMES",
    "TLS_SCHEME",
    "is_address",
    "parse_address",
    "require_grpc",
    "uses_tls",
]
