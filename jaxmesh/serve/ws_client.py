"""The client side of openpi's websocket policy protocol, for
``jaxmesh.RemotePolicy("ws://host:port")``. The protocol: docs/serving.md,
"Served over openpi's protocol: a policy for jaxmesh.evaluate".
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.frames import CloseCode, Opcode
from websockets.http11 import USER_AGENT
from websockets.protocol import State as ProtocolState
from websockets.uri import parse_uri

from jaxmesh.adapt import State, Text
from jaxmesh.errors import RemotePolicyError
from jaxmesh.host_policy import HostPolicy
from jaxmesh.model import resolve_class
from jaxmesh.remote.protocol import MAX_MESSAGE_BYTES, TOKEN_ENV
from jaxmesh.run.checks import check_int
from jaxmesh.serve import codec

#: Seconds a request waits for its reply: a large model's first (compiling)
#: forward behind a queue, yet a hung server stops the run.
DEFAULT_TIMEOUT = 120.0
#: Seconds to wait for the server's handshake and metadata.
CONNECT_TIMEOUT = 10.0
#: Connections a policy opens at most (as many as the rows of a plan need).
DEFAULT_CONNECTIONS = 16
#: The most UTF-8 bytes of an instruction (a fixed-shape array to the host).
PROMPT_BYTES = 1024
#: The request key of the observation when it is an array, not a dict.
STATE_KEY = "observation/state"
SCHEMES = ("ws://", "wss://")
#: Seconds between the keepalive thread's reads of the idle connections
#: (websockets' servers ping every 20 s and wait 20 s for the pong).
KEEPALIVE_S = 5.0
#: Seconds ``close`` waits, all connections together, for the server's close.
CLOSE_TIMEOUT = 1.0
#: The most bytes one read takes from a socket.
RECV_BYTES = 1 << 18


def default_inputs(obs: Any, instruction: str | None) -> dict:
    """The request for one lane: a dict observation's entries (an array under
    ``"observation/state"``), and ``"prompt"`` when there is an instruction."""
    request = dict(obs) if isinstance(obs, Mapping) else {STATE_KEY: obs}
    if instruction is not None:
        request["prompt"] = instruction
    return request


def env_token(token: str | None) -> str | None:
    """``token``, or ``$JAXMESH_TOKEN`` when None (TypeError: not a string)."""
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token is a {type(token).__name__}; expected a string")
    return token


def encode_prompt(instruction: str) -> np.ndarray:
    """``instruction`` as ``PROMPT_BYTES`` UTF-8 bytes, zero-padded."""
    data = instruction.encode()
    if len(data) > PROMPT_BYTES:
        raise ValueError(
            f"an instruction of {len(data)} UTF-8 bytes: a served policy's "
            f"instructions hold at most {PROMPT_BYTES}"
        )
    return np.frombuffer(data.ljust(PROMPT_BYTES, b"\0"), np.uint8)


def decode_prompt(codes: np.ndarray) -> str:
    """The instruction ``encode_prompt`` encoded."""
    return np.asarray(codes, np.uint8).tobytes().rstrip(b"\0").decode()


def _wait(sock: socket.socket, events: int, deadline: float) -> bool:
    """Whether ``sock`` is ready for ``events`` by ``deadline`` (monotonic)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(math.ceil(left * 1000)))


def _alive(ws: _Connection) -> bool:
    """Reads what an idle connection holds, without waiting: whether it is
    still open (a close, or a message nobody asked for, ends it)."""
    try:
        while ws.protocol.state is ProtocolState.OPEN:
            ws.feed(None)
    except TimeoutError:  # nothing more has arrived
        pass
    except OSError:
        return False
    try:
        return ws.message() is None and ws.protocol.state is ProtocolState.OPEN
    except ConnectionClosed:
        return False


class _Connection:
    """One websocket connection, driven by the thread that holds it:
    websockets' Sans-I/O ``ClientProtocol`` over a non-blocking socket, polled
    only when it is not ready (a write waits ``write_timeout`` s at most)."""

    __slots__ = ("sock", "protocol", "parts", "kind", "pending", "write_timeout")

    def __init__(
        self, sock: socket.socket, protocol: ClientProtocol, write_timeout: float
    ):
        sock.settimeout(0.0)
        self.sock, self.protocol = sock, protocol
        self.write_timeout = write_timeout
        #: A fragmented message's frames so far, and its opcode.
        self.parts: list[bytes] = []
        self.kind = Opcode.BINARY
        #: Frames parsed, not yet read.
        self.pending: collections.deque = collections.deque()

    def flush(self) -> None:
        """Writes what the protocol has to send (TimeoutError: the socket took
        nothing for ``write_timeout`` s; OSError: the connection broke)."""
        for data in self.protocol.data_to_send():
            if not data:  # the protocol's end of stream
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_WR)
            deadline = None
            while data:
                try:
                    data = data[self.sock.send(data) :]
                except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    if deadline is None:
                        deadline = time.monotonic() + self.write_timeout
                    if not _wait(self.sock, select.POLLOUT, deadline):
                        raise TimeoutError from None

    def send(self, frame: bytes) -> None:
        self.protocol.send_binary(frame)
        self.flush()

    def feed(self, deadline: float | None) -> None:
        """Reads what arrives by ``deadline`` (None: only what has arrived)
        into the protocol (TimeoutError: nothing came)."""
        while True:
            try:
                data = self.sock.recv(RECV_BYTES)
                break
            except (BlockingIOError, ssl.SSLWantReadError):
                if deadline is None or not _wait(self.sock, select.POLLIN, deadline):
                    raise TimeoutError from None
            except OSError:  # reset: the connection is over
                data = b""
                break
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        self.pending.extend(self.protocol.events_received())
        self.flush()

    def message(self) -> bytes | str | None:
        """The next whole message parsed (bytes, or a text frame's text), or
        None (ConnectionClosed: the connection is over)."""
        while self.pending:
            frame = self.pending.popleft()
            opcode = frame.opcode
            if opcode is Opcode.BINARY or opcode is Opcode.TEXT:
                self.kind = opcode
            elif opcode is Opcode.CLOSE:
                raise self.closed()
            elif opcode is not Opcode.CONT:
                continue  # a ping (answered) or a pong
            self.parts.append(frame.data)
            if not frame.fin:
                continue
            data, self.parts = b"".join(self.parts), []
            return data.decode(errors="replace") if self.kind is Opcode.TEXT else data
        if self.protocol.state is not ProtocolState.OPEN:
            raise self.closed()
        return None

    def receive(self, deadline: float) -> bytes | str:
        """The next message by ``deadline`` (TimeoutError), as ``message``."""
        while (message := self.message()) is None:
            if deadline <= time.monotonic():
                raise TimeoutError
            self.feed(deadline)
        return message

    def closed(self) -> ConnectionClosed:
        p = self.protocol
        return ConnectionClosed(p.close_rcvd, p.close_sent, p.close_rcvd_then_sent)

    def close(self, wait: float = 0.0) -> None:
        """Sends a close frame (once) and closes the socket, after waiting
        at most ``wait`` seconds for the server's end of stream."""
        self.write_timeout = min(self.write_timeout, CLOSE_TIMEOUT)
        try:
            if self.protocol.state is ProtocolState.OPEN:
                self.protocol.send_close(CloseCode.NORMAL_CLOSURE)
                self.flush()
            deadline = time.monotonic() + wait
            while self.protocol.state is not ProtocolState.CLOSED:
                self.feed(deadline)
        except (OSError, TimeoutError):
            pass
        finally:
            self.sock.close()


def check_seconds(name: str, value: Any, hint: str = "") -> float:
    """``value`` as seconds (ValueError: not a number > 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name}={value!r}: expected seconds > 0{hint}")
    return float(value)


class WebsocketPolicy(HostPolicy):
    """A policy served over openpi's websocket protocol: a ``HostPolicy``
    whose planning lanes each send one request, at once, and take their
    reply's ``actions`` as their chunk (or action). docs/serving.md, "Served
    over openpi's protocol: a policy for jaxmesh.evaluate".

    Args:
      address: ``ws://host:port`` (``wss://`` for TLS).
      inputs: ``inputs(obs, instruction) -> dict``, the request for one lane
        (numpy leaves; the instruction or None), or ``"module:function"``;
        default ``default_inputs`` (LIBERO's: ``libero_inputs``).
      token: sent as ``Authorization: Api-Key <token>`` (default:
        ``$JAXMESH_TOKEN``, if set).
      timeout: seconds each request may take, from its send to its reply.
      connections: the most connections open at once (and so requests in
        flight); more are opened as a plan's rows need them.
      native_chunk: the replies' chunk length K (default: the metadata's
        ``action_horizon``; None there too: one action per reply).
      instructions: give ``inputs`` each lane's instruction (a string: also
        the episode's reset-info key of it, e.g. LIBERO's ``"language"``).
      connect_timeout: seconds to wait for a connection and its metadata.

    The first connection opens here: an unreachable server fails at once.
    Against a server that batches (``batching``), a plan closes the idle
    connections first; while no plan runs, a thread answers the server's
    pings on the idle connections every ``KEEPALIVE_S`` seconds.

    Raises:
      RemotePolicyError: the server cannot be reached, refused the
        connection, or sent no metadata map.
    """

    def __init__(
        self,
        address: str,
        inputs: Callable | str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connections: int = DEFAULT_CONNECTIONS,
        native_chunk: int | None = None,
        instructions: bool | str = False,
        connect_timeout: float = CONNECT_TIMEOUT,
    ):
        if isinstance(inputs, str):
            inputs = resolve_class(inputs)
        if inputs is not None and not callable(inputs):
            raise TypeError(
                f"inputs={inputs!r}: expected a function (obs, instruction) -> "
                "dict, or 'module:function'"
            )
        if not isinstance(instructions, bool | str):
            raise TypeError(
                f"instructions={instructions!r}: expected a bool or a reset-info key"
            )
        self.inputs = inputs or default_inputs
        if not isinstance(address, str) or not address.startswith(SCHEMES):
            raise ValueError(
                f"address={address!r}: expected 'ws://host:port' or 'wss://host:port'"
            )
        self.timeout = check_seconds("timeout", timeout)
        self.connect_timeout = check_seconds("connect_timeout", connect_timeout)
        connections = check_int("connections", connections, 1, "the most open at once")
        self.token = env_token(token)
        try:
            self._uri = parse_uri(address)
        except InvalidURI as e:
            raise ValueError(f"address={address!r}: {e}") from None
        self.address, self.connections = address, connections
        #: Requests sent (one per row planned).
        self.requests = 0
        self._closed = False
        self._cond = threading.Condition()
        self._stop = threading.Event()
        #: The server's metadata map (its first frame).
        ws, self.metadata = self._connect()
        #: Idle connections, and how many are open (idle or in use).
        self._idle: list[_Connection] = [ws]
        self._open = 1
        batch = self.metadata.get("max_batch")
        #: The server batches across connections (metadata ``max_batch`` > 1).
        self.batching = isinstance(batch, int) and batch > 1
        self._keepalive = threading.Thread(
            target=self._keep_alive, name="jaxmesh-ws-keepalive", daemon=True
        )
        self._keepalive.start()
        if native_chunk is None:
            chunk = self.metadata.get("action_horizon")
            native_chunk = int(chunk) if isinstance(chunk, int | np.integer) else None
        self._prompts = instructions is not False
        spec = None
        if self._prompts:
            key = instructions if isinstance(instructions, str) else None
            spec = {"obs": State(), "prompt": Text(encode_prompt, info_key=key)}
        try:
            super().__init__(
                self._plan,
                native_chunk=native_chunk,
                spec=spec,
                name=f"remote:{address}",
            )
        except BaseException:
            self.close()
            raise

    @property
    def client(self) -> WebsocketPolicy:
        """This policy, which holds ``requests``, ``metadata`` and ``batching``."""
        return self

    def _error(self, what: str) -> RemotePolicyError:
        return RemotePolicyError(
            f"the policy server at {self.address} {what}", address=self.address
        )

    def _connect(self) -> tuple[_Connection, dict]:
        uri = self._uri
        deadline = time.monotonic() + self.connect_timeout
        sock = ws = None
        try:
            sock = socket.create_connection(
                (uri.host, uri.port), timeout=self.connect_timeout
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if uri.secure:
                sock = ssl.create_default_context().wrap_socket(
                    sock, server_hostname=uri.host
                )
            protocol = ClientProtocol(uri, max_size=MAX_MESSAGE_BYTES)
            ws = _Connection(sock, protocol, self.timeout)
            request = protocol.connect()
            if self.token:
                request.headers["Authorization"] = f"Api-Key {self.token}"
            request.headers.setdefault("User-Agent", USER_AGENT)
            protocol.send_request(request)
            ws.flush()
            while not ws.pending and protocol.handshake_exc is None:
                try:
                    ws.feed(deadline)
                except TimeoutError:
                    raise TimeoutError(
                        f"no handshake response within {self.connect_timeout:g} s"
                    ) from None
            if protocol.handshake_exc is not None:
                raise protocol.handshake_exc
            ws.pending.popleft()  # the handshake's response
        except Exception as e:  # noqa: BLE001 - OSError, a timeout, a bad handshake
            if sock is not None:
                (ws or sock).close()
            if not isinstance(e, InvalidStatus):
                raise self._error(
                    f"cannot be reached ({type(e).__name__}: {e}): start one there "
                    "(`jaxmesh serve-policy MODEL --address HOST:PORT`, or openpi's "
                    "scripts/serve_policy.py), or check the address"
                ) from None
            status = e.response.status_code
            body = (e.response.body or b"").decode(errors="replace").strip()
            fix = (
                ": pass its token (RemotePolicy(address, token=...), or set "
                f"{TOKEN_ENV})"
                if status == 401
                else ""
            )
            raise self._error(
                f"refused the connection (HTTP {status}: {body}){fix}"
            ) from None
        try:
            first = ws.receive(deadline)
            if isinstance(first, str):
                raise self._error(f"sent a text frame instead of its metadata: {first}")
            metadata = codec.unpackb(first)
            if not isinstance(metadata, dict):
                raise self._error(
                    f"sent a {type(metadata).__name__} as its metadata; openpi's "
                    "protocol begins with a map: is it an openpi policy server?"
                )
        except (codec.CodecError, TimeoutError, ConnectionClosed, OSError) as e:
            ws.close()
            raise self._error(
                f"sent no metadata map on connect ({type(e).__name__}: {e}): "
                "is it an openpi policy server?"
            ) from None
        except BaseException:
            ws.close()
            raise
        return ws, metadata

    def _take(self, want: int) -> list[_Connection]:
        """Up to ``want`` connections for one thread (at least one)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._idle or self._open < self.connections or self._closed
            )
            if self._closed:
                raise self._error("is no longer connected: the policy was closed")
            took = [self._idle.pop() for _ in range(min(want, len(self._idle)))]
            # One the server closed since (a restart, its idle timeout) is
            # replaced, not used.
            dead = [ws for ws in took if not _alive(ws)]
            took = [ws for ws in took if ws not in dead]
            self._open -= len(dead)
            new = min(want - len(took), self.connections - self._open)
            self._open += new
            if self.batching:  # closed, so that the server does not wait for them
                dead += self._idle
                self._open -= len(self._idle)
                self._idle = []
        for ws in dead:
            ws.close()
        try:
            for _ in range(new):
                took.append(self._connect()[0])
                new -= 1
        except BaseException:
            self._give(took, [])
            with self._cond:
                self._open -= new
                self._cond.notify_all()
            raise
        return took

    def _give(self, healthy: list[_Connection], broken: list[_Connection]) -> None:
        """Returns a thread's connections: the healthy to the pool, the
        broken (and all, once the policy is closed) closed."""
        with self._cond:
            if self._closed:
                healthy, broken = [], healthy + broken
            self._idle.extend(healthy)
            self._open -= len(broken)
            self._cond.notify_all()
        for ws in broken:
            ws.close()

    def _keep_alive(self) -> None:
        """Reads the idle connections now and then (under the pool's lock):
        pings are answered, a connection the server closed is dropped."""
        while not self._stop.wait(KEEPALIVE_S):
            with self._cond:
                idle = self._idle
                self._idle = [ws for ws in idle if _alive(ws)]
                dead = [ws for ws in idle if ws not in self._idle]
            self._give([], dead)

    def infer_rows(self, n: int, frame: Callable[[int], bytes]) -> list[Any]:
        """The replies to the ``n`` requests ``frame(i)`` packs (each as it
        goes out), in order, over at most ``connections`` connections.

        Raises:
          RemotePolicyError: a request failed (the first failed row's error).
          what ``frame`` raises (its row's request is not sent).
        """
        if not n:
            return []
        pool = self._take(min(n, self.connections))
        c = len(pool)
        sent = [0.0] * c
        busy = [False] * c
        out: list[Any] = [None] * n
        requests = 0

        def send(j: int, row: int) -> None:
            nonlocal requests
            data = frame(row)
            busy[j] = True
            requests += 1
            pool[j].send(data)
            sent[j] = time.monotonic()

        try:
            for j in range(c):
                send(j, j)
            for row in range(n):
                j = row % c
                reply = pool[j].receive(sent[j] + self.timeout)
                busy[j] = isinstance(reply, str)  # the server closes it after
                if busy[j]:
                    raise self._error(f"failed the request:\n{reply}")
                if row + c < n:
                    send(j, row + c)
                try:
                    out[row] = codec.unpackb(reply)
                except codec.CodecError as e:
                    raise self._error(
                        f"sent a reply that is not openpi's msgpack: {e}"
                    ) from None
        except TimeoutError:
            raise self._error(
                f"did not answer a request within {self.timeout:g} s: check "
                "that it is running and not overloaded, or pass a larger "
                "timeout= to RemotePolicy"
            ) from None
        except (ConnectionClosed, OSError) as e:
            rcvd = getattr(e, "rcvd", None)
            code, reason = (rcvd.code, rcvd.reason) if rcvd else (None, "")
            raise self._error(
                f"closed the connection (code {code}"
                f"{': ' + reason if reason else ''}): "
                "check the server's log and start it again; the episodes "
                "finished so far are on exc.partial_result"
            ) from None
        finally:
            with self._cond:
                self.requests += requests
            self._give(
                [ws for ws, b in zip(pool, busy, strict=True) if not b],
                [ws for ws, b in zip(pool, busy, strict=True) if b],
            )
        return out

    def close(self) -> None:
        """Closes every connection and ends the client's keepalive thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        self._stop.set()
        self._keepalive.join()
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for ws in idle:
            ws.close(max(0.0, deadline - time.monotonic()))

    def _plan(self, obs: Any) -> np.ndarray:
        """The actions of B rows: one request per row, sent at once."""
        codes = None
        if self._prompts:
            obs, codes = obs["obs"], obs["prompt"]
        leaves, tree = jax.tree.flatten(obs)

        def frame(i: int) -> bytes:
            row = tree.unflatten([x[i] for x in leaves])
            said = None if codes is None else decode_prompt(codes[i])
            return codec.packb(self.inputs(row, said))

        k = self.native_chunk
        out = []  # each reply's actions, stacked: [B, K, *A] or [B, *A]
        for reply in self.infer_rows(leaves[0].shape[0], frame):
            actions = reply.get("actions") if isinstance(reply, dict) else None
            if actions is None:
                what = (
                    f"keys {sorted(map(str, reply))}"
                    if isinstance(reply, dict)
                    else f"a {type(reply).__name__}"
                )
                raise self._error(
                    f"replied without 'actions' ({what}): it must answer each "
                    "request with a map holding the actions"
                )
            actions = np.asarray(actions)
            if actions.dtype.kind not in "biuf" or (
                k is not None and (actions.ndim == 0 or actions.shape[0] != k)
            ):
                want = "numbers" if k is None else f"[{k}, ...] (a chunk of {k})"
                raise self._error(
                    f"replied actions of shape {actions.shape} and dtype "
                    f"{actions.dtype}; expected {want}: pass native_chunk= the "
                    "length of its chunks (None for one action per reply)"
                )
            if out and actions.shape != out[0].shape:
                raise self._error(
                    f"replied actions of shapes {out[0].shape} and "
                    f"{actions.shape} to one plan; expected one shape"
                )
            out.append(actions)
        return np.stack(out)

    def __enter__(self) -> WebsocketPolicy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemotePolicy({self.address!r})"


__all__ = [
    "DEFAULT_CONNECTIONS",
    "DEFAULT_TIMEOUT",
    "RemotePolicyError",
    "WebsocketPolicy",
    "decode_prompt",
    "default_inputs",
    "encode_prompt",
]
