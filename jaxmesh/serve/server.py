"""``jaxmesh.PolicyServer``: one jitted model behind many clients, batched.
Security as for ``jaxmesh.EnvServer``: docs/serving.md, "Security and limits".
"""

from __future__ import annotations

import ssl
import threading
from pathlib import Path
from typing import Any

import grpc

from jaxmesh._version import __version__
from jaxmesh.remote.protocol import MAX_MESSAGE_BYTES
from jaxmesh.remote.server.options import check_token, listen_address
from jaxmesh.serve.agents import Pools
from jaxmesh.serve.batcher import Batcher, BatchStats, Options
from jaxmesh.serve.codec import MAX_INFLIGHT_BYTES
from jaxmesh.serve.forward import ServedModel
from jaxmesh.serve.grpc_service import GrpcService
from jaxmesh.serve.openpi import OpenpiService
from jaxmesh.serve.ws_client import check_seconds

#: The protocols a ``PolicyServer`` speaks.
PROTOCOLS = ("openpi", "grpc")


def _credentials(tls: Any, protocol: str) -> Any:
    """``tls`` as an ``ssl.SSLContext`` (openpi) or ``grpc.ServerCredentials``."""
    grpc_ = protocol == "grpc"
    if tls is None or isinstance(
        tls, grpc.ServerCredentials if grpc_ else ssl.SSLContext
    ):
        return tls
    if not (isinstance(tls, tuple | list) and len(tls) == 2):
        raise TypeError(
            f"tls={tls!r}: protocol='grpc' takes (cert PEM path, key PEM path) or "
            "grpc.ServerCredentials (an ssl.SSLContext is for protocol='openpi')"
            if grpc_
            else f"tls={tls!r}: expected None, an ssl.SSLContext, or (cert PEM "
            "path, key PEM path)"
        )
    try:
        if grpc_:
            cert, key = (Path(f).read_bytes() for f in tls)
            return grpc.ssl_server_credentials([(key, cert)])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        return context
    except (OSError, ssl.SSLError) as e:
        raise ValueError(
            f"tls={tuple(tls)!r}: cannot {'read' if grpc_ else 'load'} the "
            f"certificate and its key ({e}); expected two PEM files"
        ) from e


class PolicyServer:
    """Serves a model to many clients at once, batching their requests
    (docs/serving.md).

    Args:
      model: a ``jaxmesh.Model`` or a single-lane policy function (over
        ``"openpi"``, one whose inputs are the current observation).
      address: ``"host:port"`` to bind; port 0 picks a free one. A host other
        than loopback needs ``token``, ``tls`` or ``insecure=True``.
      protocol: ``"openpi"`` (openpi's websocket protocol) or ``"grpc"``
        (jaxmesh's own, for ``jaxmesh.RemotePolicy``).
      max_batch: the most requests one forward takes (``"grpc"``: the client
        lanes one agent step holds).
      max_wait_ms: how long a forward waits for more requests after its
        oldest arrived.
      token: the key clients must send (``Authorization: Api-Key <token>``).
      tls: ``(cert PEM, key PEM)`` paths, or an ``ssl.SSLContext``
        (``"openpi"`` only).
      insecure: allow a non-loopback address with no token and no TLS.
      example: ``"openpi"``: an observation to compile for in ``start``.
      inputs: ``"openpi"``: observation key -> ``(shape, dtype)`` (or
        ``"float32[8]"``) of each key the spec reads; None: any layout.
      metadata: more entries for the map a client receives first.
      max_message_bytes: the largest frame either way.
      max_connections: clients served at once; more are refused.
      max_inflight_bytes: the request bytes all connections may hold at once
        (default: the larger of 1 GiB and ``max_message_bytes``).
      seed: ``"openpi"``: request i draws with ``fold_in(PRNGKey(seed), i)``.
      idle_timeout: ``"grpc"``: seconds a session may send nothing before it
        is ended (``math.inf``: never).
      max_lanes: ``"grpc"``: the most lanes one session may open.

    Raises:
      ValueError: a bad argument; a non-loopback address with no token, TLS
        or ``insecure``; a model that keeps state per episode.
      TypeError: a bad ``tls``.
    """

    def __init__(
        self,
        model: Any,
        address: str = "127.0.0.1:0",
        *,
        protocol: str = "openpi",
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
        token: str | None = None,
        tls: Any = None,
        insecure: bool = False,
        example: Any = None,
        inputs: dict | None = None,
        metadata: dict | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_connections: int = 1024,
        seed: int = 0,
        max_inflight_bytes: int | None = None,
        idle_timeout: float = 300.0,
        max_lanes: int = 4096,
    ):
        if protocol not in PROTOCOLS:
            raise ValueError(
                f"protocol={protocol!r}: expected one of {PROTOCOLS} ('openpi': "
                "the websocket protocol openpi-client speaks; 'grpc': jaxmesh's "
                "own, for jaxmesh.RemotePolicy)"
            )
        check_token(token, "token=...", "in an HTTP header")
        context = _credentials(tls, protocol)
        secured = bool(token) or context is not None or insecure
        host, port = listen_address(
            address, secured, "run the policy", "token=...", "tls="
        )
        for name, value, low in (
            ("max_message_bytes", max_message_bytes, 1024),
            ("max_connections", max_connections, 1),
            ("max_inflight_bytes", max_inflight_bytes, 1024),
            ("max_lanes", max_lanes, 1),
        ):
            if value is None and name == "max_inflight_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r}: expected an int >= {low}")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata={metadata!r}: expected a dict or None")
        self.protocol = protocol
        self._requested = address
        if protocol == "grpc":
            for name, value, why in (
                ("example", example, "compiles for each client's env when"),
                ("inputs", inputs, "reads each client's observation layout when"),
            ):
                if value is not None:
                    raise ValueError(
                        f"{name}=...: protocol='grpc' {why} the client opens its "
                        f"session; drop {name}="
                    )
            self._served: Any = Pools(model, max_batch=max_batch, max_lanes=max_lanes)
        else:
            self._served = ServedModel(
                model, max_batch=max_batch, seed=seed, inputs=inputs
            )
        self._batcher = Batcher(self._served, max_wait_ms=max_wait_ms)
        self._example = example
        self._opts = Options(
            host=host,
            port=port,
            token=token,
            tls=context,
            max_message_bytes=max_message_bytes,
            max_connections=max_connections,
            max_inflight_bytes=max_inflight_bytes
            or max(MAX_INFLIGHT_BYTES, max_message_bytes),
            idle_timeout=check_seconds(
                "idle_timeout", idle_timeout, " (math.inf: no limit)"
            ),
            metadata={
                "server": "jaxmesh",
                "version": __version__,
                "policy": self._served.name,
                "action_chunk": self._served.policy.native_chunk,
                # openpi's name for the actions one reply holds (its model
                # configs' and ActionChunkBroker's ``action_horizon``).
                "action_horizon": getattr(self._served, "reply_length", None),
                "max_batch": max_batch,
                **(metadata or {}),
            },
        )
        self._service: Any = None
        self._address: str | None = None
        self._started = False
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        """The bound ``"host:port"`` (the actual port once started)."""
        return self._address or self._requested

    @property
    def url(self) -> str:
        """``ws://host:port`` (``wss://`` with TLS; ``grpc://``, ``grpcs://``
        for protocol ``"grpc"``): what clients dial."""
        scheme = "grpc" if self.protocol == "grpc" else "ws"
        tls = "s" if self._opts.tls is not None else ""
        return f"{scheme}{tls}://{self.address}"

    @property
    def expects(self) -> str:
        """What a request holds, in words."""
        if self.protocol == "grpc":
            return "a RemotePolicy session (the layout of the client's env)"
        return self._served.expects()

    @property
    def stats(self) -> BatchStats:
        """Forwards, requests and batch sizes so far (``BatchStats``)."""
        return self._batcher.stats

    @property
    def compiled(self) -> int:
        """Programs compiled so far (observation layouts x batch sizes)."""
        return self._served.compiled()

    def start(self) -> PolicyServer:
        """Compiles for ``example`` (if given), binds and serves in threads.

        Returns:
          self, serving; ``address`` holds the actual port.

        Raises:
          RuntimeError: started twice.
          OSError: the address cannot be bound.
          ValueError: the model cannot run ``example``.
        """
        if self._started:
            raise RuntimeError("this PolicyServer has already started")
        self._started = True
        example = self._example
        if example is None and self.protocol == "openpi":
            example = self._served.example()  # the declared inputs, if any
        if example is not None:
            self._served.warm_up(self._served.prepare(example))
        service = GrpcService if self.protocol == "grpc" else OpenpiService
        self._service = service(self._batcher, self._opts)
        self._batcher.start()
        try:
            port = self._service.start()
        except BaseException:
            self._batcher.close()
            raise
        self._address = f"{self._opts.host}:{port}"
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Closes every connection, fails what waits, joins every thread.
        Safe to call twice."""
        if self.protocol == "grpc":  # steps in flight fail first, then streams end
            self._batcher.close(timeout)
        if self._service is not None:
            self._service.shutdown(timeout)
        self._batcher.close(timeout)
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the server has shut down (or ``timeout`` seconds);
        returns whether it has."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> PolicyServer:
        return self if self._started else self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"PolicyServer({self._served.name!r}, address={self.address!r}, "
            f"protocol={self.protocol!r})"
        )


__all__ = ["Options", "PROTOCOLS", "PolicyServer"]
