"""Served envs' and policies' credentials: the session token and TLS from PEM
files (gRPC, the ``[remote]`` extra, is imported only when TLS is asked for)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jaxmesh.cli.errors import ConfigError
from jaxmesh.remote.protocol import TOKEN_ENV


def token_of(given: str | None) -> str | None:
    """``--token``, else ``$JAXMESH_TOKEN`` (None: neither, or empty)."""
    return (given if given is not None else os.environ.get(TOKEN_ENV)) or None


def channel_credentials(ca: str | None) -> Any:
    """``grpc.ssl_channel_credentials`` trusting the PEM file ``ca`` (None: none)."""
    if ca is None:
        return None
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())


def tls_files(cert: str | None, key: str | None) -> tuple[str, str] | None:
    """``--tls-cert`` and ``--tls-key``: both, or neither (None: no TLS)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError(
            f"--tls-cert {cert!r} and --tls-key {key!r}: TLS needs both the "
            "certificate chain and its private key (PEM files); give both, or "
            "neither for a plain server"
        )
    return cert, key


def server_credentials(cert: str | None, key: str | None) -> Any:
    """``grpc.ssl_server_credentials`` from PEM files (None: no TLS)."""
    if tls_files(cert, key) is None:
        return None
    import grpc

    pems = []
    for flag, path in (("--tls-key", key), ("--tls-cert", cert)):
        try:
            pems.append(Path(path).read_bytes())
        except OSError as e:
            raise ConfigError(f"{flag} {path!r}: cannot read it ({e})") from e
    return grpc.ssl_server_credentials([(pems[0], pems[1])])
