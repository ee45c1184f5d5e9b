"""The client side of openpi's websocket policy protocol, for
``jaxmesh.RemotePolicy("ws://host:port")``.

The protocol, as ``openpi-client``'s ``WebsocketClientPolicy`` speaks it (and
jaxmesh's ``serve-policy`` and openpi's own server serve it): on connect the
server sends a metadata map; then each binary frame the client sends is one
observation (msgpack, arrays as ``jaxmesh.serve.codec`` writes them) and is
answered by one frame ``{"actions": [K, *A] or [*A], ...}``. A request the
server cannot answer gets a text frame saying why, and its connection closes.
A token travels as the header ``Authorization: Api-Key <token>``.

``WebsocketClient.infer`` sends a plan's B requests at once over a pool of at
most ``connections`` connections, one request per row, so a batching server
batches them; the connections and their asyncio loop live in one thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from jaxmesh.adapt import State, Text
from jaxmesh.host_policy import HostPolicy
from jaxmesh.model import resolve_class
from jaxmesh.remote.protocol import MAX_MESSAGE_BYTES, TOKEN_ENV
from jaxmesh.serve import codec

#: Seconds a request waits for its reply by default: long enough for a large
#: model's first (compiling) forward behind a queue of other requests, short
#: enough that a hung server stops the run.
DEFAULT_TIMEOUT = 120.0
#: Seconds to wait for the server's handshake and metadata.
CONNECT_TIMEOUT = 10.0
#: Connections a policy opens at most (as many as the rows of a plan need).
DEFAULT_CONNECTIONS = 16
#: The most UTF-8 bytes of an instruction (it reaches the host callback as a
#: fixed-shape array).
PROMPT_BYTES = 1024
#: The request key of the observation when it is an array, not a dict.
STATE_KEY = "observation/state"
SCHEMES = ("ws://", "wss://")


class RemotePolicyError(RuntimeError):
    """A policy served over openpi's protocol failed: unreachable, refused,
    closed, a server error, a timeout, or a reply without usable ``actions``.

    Attributes:
      address: the server's ``ws://`` address.
      partial_result: every episode finished before the run stopped (set by
        ``jaxmesh.evaluate``), or None.
    """

    def __init__(self, message: str, *, address: str):
        super().__init__(message)
        self.address = address
        self.partial_result = None


def default_inputs(obs: Any, instruction: str | None) -> dict:
    """The request for one lane: a dict observation's entries under their own
    keys (an array under ``"observation/state"``), and ``"prompt"`` when there
    is an instruction."""
    request = dict(obs) if isinstance(obs, Mapping) else {STATE_KEY: obs}
    if instruction is not None:
        request["prompt"] = instruction
    return request


def encode_prompt(instruction: str) -> np.ndarray:
    """``instruction`` as ``PROMPT_BYTES`` UTF-8 bytes, zero-padded (the
    ``Text`` encoding that carries it to the host callback)."""
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


class WebsocketClient:
    """Connections to one server of openpi's protocol.

    Args:
      address: ``ws://host:port`` (or ``wss://`` for TLS).
      token: sent as ``Authorization: Api-Key <token>`` (default: the
        ``JAXMESH_TOKEN`` environment variable, if set).
      timeout: seconds each request may take, from its send to its reply
        (default ``DEFAULT_TIMEOUT``, 120).
      connections: the most connections open at once (and so requests in
        flight); more are opened as a plan's rows need them.
      connect_timeout: seconds to wait for a connection and its metadata.

    The first connection opens here: an unreachable server fails at once.

    Raises:
      RemotePolicyError: the server cannot be reached, refused the
        connection, or sent no metadata map.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connections: int = DEFAULT_CONNECTIONS,
        connect_timeout: float = CONNECT_TIMEOUT,
    ):
        if not isinstance(address, str) or not address.startswith(SCHEMES):
            raise ValueError(
                f"address={address!r}: expected 'ws://host:port' or 'wss://host:port'"
            )
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or value <= 0
            ):
                raise ValueError(f"{name}={value!r}: expected seconds > 0")
        if isinstance(connections, bool) or not isinstance(connections, int):
            raise TypeError(f"connections={connections!r}: expected an int >= 1")
        if connections < 1:
            raise ValueError(f"connections={connections!r}: expected an int >= 1")
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if token is not None and not isinstance(token, str):
            raise TypeError(f"token is a {type(token).__name__}; expected a string")
        self.address, self.token = address, token
        self.timeout, self.connect_timeout = float(timeout), float(connect_timeout)
        self.connections = connections
        #: Requests sent (one per row planned).
        self.requests = 0
        self._idle: list[ClientConnection] = []
        self._slots: asyncio.Semaphore | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="jaxmesh-ws-policy", daemon=True
        )
        self._thread.start()
        try:
            #: The server's metadata map (its first frame).
            self.metadata: dict = self._run(self._start())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _error(self, what: str) -> RemotePolicyError:
        return RemotePolicyError(
            f"the policy server at {self.address} {what}", address=self.address
        )

    # Connections -------------------------------------------------------------
    async def _start(self) -> dict:
        self._slots = asyncio.Semaphore(self.connections)
        ws, metadata = await self._connect()
        self._idle.append(ws)
        return metadata

    async def _connect(self) -> tuple[ClientConnection, dict]:
        """A new connection and its metadata."""
        headers = {"Authorization": f"Api-Key {self.token}"} if self.token else None
        try:
            ws = await connect(
                self.address,
                additional_headers=headers,
                compression=None,
                max_size=MAX_MESSAGE_BYTES,
                open_timeout=self.connect_timeout,
                close_timeout=1.0,
            )
        except InvalidStatus as e:
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
        except InvalidURI as e:
            raise ValueError(f"address={self.address!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 - OSError, a timeout, a bad handshake
            raise self._error(
                f"cannot be reached ({type(e).__name__}: {e}): start one there "
                "(`jaxmesh serve-policy MODEL --address HOST:PORT`, or openpi's "
                "scripts/serve_policy.py), or check the address"
            ) from None
        try:
            async with asyncio.timeout(self.connect_timeout):
                first = await ws.recv()
            if isinstance(first, str):
                raise self._error(f"sent a text frame instead of its metadata: {first}")
            metadata = codec.unpackb(first)
            if not isinstance(metadata, dict):
                raise self._error(
                    f"sent a {type(metadata).__name__} as its metadata; openpi's "
                    "protocol begins with a map: is it an openpi policy server?"
                )
        except BaseException as e:
            await ws.close()
            if isinstance(e, RemotePolicyError):
                raise
            if isinstance(e, codec.CodecError | TimeoutError | ConnectionClosed):
                raise self._error(
                    f"sent no metadata map on connect ({type(e).__name__}: {e}): "
                    "is it an openpi policy server?"
                ) from None
            raise
        return ws, metadata

    # Requests ----------------------------------------------------------------
    def infer(self, frames: list[bytes]) -> list[Any]:
        """The replies to ``frames`` (packed requests), in order; all are sent
        at once, over at most ``connections`` connections.

        Raises:
          RemotePolicyError: a request failed (the first failed row's error).
        """
        self.requests += len(frames)
        replies = self._run(self._all(frames))
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    async def _all(self, frames: list[bytes]) -> list[Any]:
        jobs = [self._one(frame) for frame in frames]
        return await asyncio.gather(*jobs, return_exceptions=True)

    async def _one(self, frame: bytes) -> Any:
        assert self._slots is not None
        async with self._slots:
            ws = self._idle.pop() if self._idle else (await self._connect())[0]
            healthy = False
            try:
                async with asyncio.timeout(self.timeout):
                    await ws.send(frame)
                    reply = await ws.recv()
                healthy = not isinstance(reply, str)
            except TimeoutError:
                raise self._error(
                    f"did not answer a request within {self.timeout:g} s: check "
                    "that it is running and not overloaded, or pass a larger "
                    "timeout= to RemotePolicy"
                ) from None
            except ConnectionClosed as e:
                raise self._error(
                    f"closed the connection (code {e.rcvd.code if e.rcvd else None}"
                    f"{': ' + e.rcvd.reason if e.rcvd and e.rcvd.reason else ''}): "
                    "check the server's log and start it again; the episodes "
                    "finished so far are on exc.partial_result"
                ) from None
            finally:
                if healthy:
                    self._idle.append(ws)
                else:
                    await ws.close()
        if isinstance(reply, str):
            raise self._error(f"failed the request:\n{reply}")
        try:
            return codec.unpackb(reply)
        except codec.CodecError as e:
            raise self._error(
                f"sent a reply that is not openpi's msgpack: {e}"
            ) from None

    def close(self) -> None:
        """Closes every connection and ends the client's thread."""
        if not self._thread.is_alive():
            return

        async def close_all() -> None:
            idle, self._idle = self._idle, []
            await asyncio.gather(*(ws.close() for ws in idle), return_exceptions=True)

        try:
            self._run(close_all())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


class WebsocketPolicy(HostPolicy):
    """A policy served over openpi's websocket protocol, as
    ``jaxmesh.RemotePolicy("ws://host:port", ...)`` builds it: a
    ``jaxmesh.HostPolicy`` whose lanes that plan each send one request, at
    once, and take their reply's ``actions`` as their chunk (or action).

    Args:
      address: ``ws://host:port`` (``wss://`` for TLS).
      inputs: ``inputs(obs, instruction) -> dict``, the request for one lane
        (numpy leaves, no lane axis; the instruction or None), or
        ``"module:function"``; default ``default_inputs``. openpi's LIBERO
        client's: ``jaxmesh.serve.libero_inputs.libero_inputs``.
      token: the server's ``Api-Key`` (default: ``$JAXMESH_TOKEN``, if set).
      timeout: seconds a request may take (default 120).
      connections: the most connections (and requests in flight) at once
        (default 16).
      native_chunk: the length K of the replies' chunks (default: the
        metadata's ``action_horizon``, which jaxmesh's ``serve-policy``
        sends; openpi's own server needs it given); None there too: one
        action per reply.
      instructions: give ``inputs`` each lane's instruction (True: the run's
        ``Starts(instruction=)`` or a suite task's; a string: also the
        episode's reset-info key, e.g. LIBERO's ``"language"``).
      connect_timeout: seconds to wait for a connection (default 10).

    The server is reached here (``RemotePolicyError`` if it cannot be). When
    a run traces, one row of zeros is sent to learn the actions' shape (as
    for any HostPolicy). ``close()`` (or ``with``) closes the connections.
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
        self.client = WebsocketClient(
            address,
            token=token,
            timeout=timeout,
            connections=connections,
            connect_timeout=connect_timeout,
        )
        self.address = address
        meta = self.client.metadata
        if native_chunk is None:
            chunk = meta.get("action_horizon")
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
            self.client.close()
            raise

    def _plan(self, obs: Any) -> np.ndarray:
        """The actions of B rows: one request per row, sent at once."""
        codes = None
        if self._prompts:
            obs, codes = obs["obs"], obs["prompt"]
        rows = jax.tree.leaves(obs)[0].shape[0]
        frames = []
        for i in range(rows):
            row = jax.tree.map(lambda x, i=i: x[i], obs)
            said = None if codes is None else decode_prompt(codes[i])
            frames.append(codec.packb(self.inputs(row, said)))
        return self._actions(self.client.infer(frames))

    def _actions(self, replies: list[Any]) -> np.ndarray:
        """The replies' ``actions``, stacked: ``[B, K, *A]`` or ``[B, *A]``."""
        k = self.native_chunk
        out = []
        for reply in replies:
            actions = reply.get("actions") if isinstance(reply, dict) else None
            if actions is None:
                what = (
                    f"keys {sorted(map(str, reply))}"
                    if isinstance(reply, dict)
                    else f"a {type(reply).__name__}"
                )
                raise self.client._error(
                    f"replied without 'actions' ({what}): it must answer each "
                    "request with a map holding the actions"
                )
            actions = np.asarray(actions)
            if actions.dtype.kind not in "biuf" or (
                k is not None and (actions.ndim == 0 or actions.shape[0] != k)
            ):
                want = "numbers" if k is None else f"[{k}, ...] (a chunk of {k})"
                raise self.client._error(
                    f"replied actions of shape {actions.shape} and dtype "
                    f"{actions.dtype}; expected {want}: pass native_chunk= the "
                    "length of its chunks (None for one action per reply)"
                )
            if out and actions.shape != out[0].shape:
                raise self.client._error(
                    f"replied actions of shapes {out[0].shape} and "
                    f"{actions.shape} to one plan; expected one shape"
                )
            out.append(actions)
        return np.stack(out)

    def close(self) -> None:
        """Closes the connections."""
        self.client.close()

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
    "WebsocketClient",
    "WebsocketPolicy",
    "decode_prompt",
    "default_inputs",
    "encode_prompt",
]
