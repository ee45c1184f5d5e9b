"""Served-env addresses (``"grpc://host:port"``, ``"grpcs://"``), without gRPC."""

from __future__ import annotations

from typing import Any

TLS_SCHEME = "grpcs://"
SCHEMES = ("grpc://", TLS_SCHEME)
INSTALL = "pip install 'jaxmesh[remote]'"


def is_address(env: Any) -> bool:
    """Whether ``env`` is a served env's address or a list of them."""
    envs = [env] if isinstance(env, str) else env
    return (
        isinstance(envs, list | tuple)
        and len(envs) > 0
        and all(isinstance(e, str) and e.startswith(SCHEMES) for e in envs)
    )


def uses_tls(address: str) -> bool:
    return isinstance(address, str) and address.startswith(TLS_SCHEME)


def host_port(target: Any, *, bind: bool = False) -> tuple[str, int] | None:
    """``(host, port)`` of ``"host:port"`` or ``"[v6]:port"`` (None: not one);
    port 0 (a free one) only with ``bind``."""
    if not isinstance(target, str):
        return None
    host, sep, port = target.rpartition(":")
    if (
        not (sep and host and port.isdigit())
        or host.startswith("[") ^ host.endswith("]")
        or not (0 if bind else 1) <= int(port) <= 65535
    ):
        return None
    return host, int(port)


def parse_address(address: Any) -> str:
    """An address as gRPC's ``"host:port"`` (TypeError, ValueError)."""
    if not isinstance(address, str):
        raise TypeError(f"address {address!r}: expected a string 'grpc://host:port'")
    target = next(
        (address[len(s) :] for s in SCHEMES if address.startswith(s)), address
    )
    if host_port(target) is None:
        raise ValueError(
            f"address {address!r} is not 'grpc://host:port' with a port in "
            "1..65535 (e.g. 'grpc://127.0.0.1:5555'); pass the address "
            "`jaxmesh serve-env` printed"
        )
    return target


def require_grpc() -> None:
    """ImportError with the install line when the [remote] extra is missing."""
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"served envs need gRPC, which is not installed; run: {INSTALL}"
        ) from exc
