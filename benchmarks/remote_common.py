"""Helpers for ``remote.py``: served envs in a child process, the synthetic env.

Kept apart from ``remote.py`` so that a ``multiprocessing`` spawn child imports
only this (gymnasium, and rlmesh or jaxmesh for the server it runs), never the
benchmark's own setup.

A server runs in a child process started with the ``spawn`` method: the child
builds its envs, starts the server on ``127.0.0.1:0`` and sends the bound
address back on a pipe once ``start()`` has returned (the server then accepts
calls); it serves until the parent sends "stop" or closes the pipe, then shuts
the server down. ``ServerPool`` starts several at once and shares them between
sections.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

#: Seconds a child may take to import, build its envs and start its server.
START_TIMEOUT_S = 120.0
#: Seconds a child may take to shut its server down before it is terminated.
STOP_TIMEOUT_S = 30.0
#: The workflow edition rlmesh 0.1.0 is pinned to here (silences its warning).
RLMESH_EDITION = "2026.06"


@functools.cache
def oversleep_s() -> float:
    """How much longer than asked ``time.sleep`` sleeps here (median of 21)."""
    ask, late = 100e-6, []
    for _ in range(21):
        t0 = time.perf_counter()
        time.sleep(ask)
        late.append(time.perf_counter() - t0 - ask)
    return max(0.0, float(np.median(late)))


class SlowEnv(gym.Env):
    """A synthetic env whose every step costs ``step_ms`` of wall clock.

    The cost is ``time.sleep``: it releases the GIL and uses no CPU, like a
    simulator waiting on another process or a device. A sleep overshoots by a
    roughly fixed amount (~60 us on Linux), measured once per process
    (:func:`oversleep_s`) and taken off each step's sleep. Observations are 4
    float32 values drifting with the action; reward 1 per step; an episode is
    truncated after ``episode_steps`` steps (it never terminates), so every
    episode has the same length whatever the policy does.

    Args:
      step_ms: milliseconds each ``step`` sleeps.
      episode_steps: steps per episode.
    """

    metadata = {"render_modes": []}

    def __init__(self, step_ms: float = 2.0, episode_steps: int = 50):
        self.step_s = step_ms / 1000.0
        self.episode_steps = episode_steps
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._obs = np.zeros(4, np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._obs = self.np_random.uniform(-0.05, 0.05, 4).astype(np.float32)
        self._t = 0
        return self._obs.copy(), {}

    def step(self, action):
        time.sleep(max(0.0, self.step_s - oversleep_s()))
        self._t += 1
        self._obs = (self._obs + (0.01 if int(action) else -0.01)).astype(np.float32)
        truncated = self._t >= self.episode_steps
        return self._obs.copy(), 1.0, False, truncated, {}


def make_envs(kind: str, n: int, **kwargs: Any) -> list[gym.Env]:
    """``n`` independent envs: ``"cartpole"`` (gymnasium CartPole-v1),
    ``"halfcheetah"`` (gymnasium HalfCheetah-v5, MuJoCo) or ``"slow"``.

    Raises:
      ValueError: an unknown kind.
    """
    if kind == "cartpole":
        return [gym.make("CartPole-v1") for _ in range(n)]
    if kind == "halfcheetah":
        return [gym.make("HalfCheetah-v5") for _ in range(n)]
    if kind == "slow":
        return [SlowEnv(**kwargs) for _ in range(n)]
    raise ValueError(f"env kind {kind!r}: expected 'cartpole', 'halfcheetah' or 'slow'")


def _serve(server_kind: str, env_kind: str, n: int, kwargs: dict, conn) -> None:
    """The child process: build the envs, serve them until told to stop."""
    try:
        envs = make_envs(env_kind, n, **kwargs)
        if server_kind == "rlmesh":
            import rlmesh

            options = rlmesh.ServeOptions(workflow_edition=RLMESH_EDITION)
            server = rlmesh.EnvServer(envs, "127.0.0.1:0", options=options)
        elif server_kind == "jaxmesh":
            import jaxmesh

            server = jaxmesh.EnvServer(envs, "127.0.0.1:0")
        else:
            raise ValueError(f"server kind {server_kind!r}: expected rlmesh|jaxmesh")
        server.start()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", str(server.address)))
    try:
        conn.recv()  # "stop", or EOFError when the parent has gone
    except EOFError:
        pass
    finally:
        server.shutdown()


class _Child:
    """One server child process: spawned at once, its address awaited later."""

    def __init__(self, server_kind: str, env_kind: str, n: int, kwargs: dict):
        self.what = f"the {server_kind} server of {n} {env_kind} envs"
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(server_kind, env_kind, n, kwargs, child), daemon=True
        )
        self.proc.start()
        child.close()
        self._address: str | None = None

    def address(self) -> str:
        """The bound address, once the child reports it.

        Raises:
          RuntimeError: the child failed to start its server (its traceback is
            in the message) or reported nothing within ``START_TIMEOUT_S``.
        """
        if self._address is None:
            if not self.conn.poll(START_TIMEOUT_S):
                raise RuntimeError(
                    f"{self.what} (pid {self.proc.pid}) reported no address within "
                    f"{START_TIMEOUT_S:.0f} s; expected ('ok', address) on its pipe"
                )
            status, payload = self.conn.recv()
            if status != "ok":
                raise RuntimeError(f"{self.what} could not start serving:\n{payload}")
            self._address = payload
        return self._address

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send("stop")
        self.proc.join(STOP_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(STOP_TIMEOUT_S)
        self.conn.close()


class ServerPool:
    """Server child processes shared by the benchmark's sections.

    ``start`` spawns children without waiting (several start at once);
    ``address`` waits for one, starting it first if needed; ``close`` stops
    them all. A server is named by (server kind, env kind, lanes, env kwargs).

    Example:
        >>> with ServerPool() as pool:  # doctest: +SKIP
        ...     pool.start(("jaxmesh", "cartpole", 64), ("rlmesh", "cartpole", 64))
        ...     address = pool.address("jaxmesh", "cartpole", 64)
    """

    def __init__(self) -> None:
        self._children: dict[tuple, _Child] = {}

    @staticmethod
    def _key(server_kind: str, env_kind: str, n: int, **kwargs: Any) -> tuple:
        return (server_kind, env_kind, n, tuple(sorted(kwargs.items())))

    def start(self, *specs: tuple) -> None:
        """Spawns the servers named by ``specs`` (each as ``address``'s args)."""
        for spec in specs:
            kwargs = spec[3] if len(spec) > 3 else {}
            key = self._key(*spec[:3], **kwargs)
            if key not in self._children:
                self._children[key] = _Child(*spec[:3], dict(kwargs))

    def address(self, server_kind: str, env_kind: str, n: int, **kwargs: Any) -> str:
        """The address of the server (``server_kind``, ``env_kind``, ``n``, kwargs).

        Args:
          server_kind: ``"rlmesh"`` (``rlmesh.EnvServer`` over a list of envs) or
            ``"jaxmesh"`` (``jaxmesh.EnvServer`` over a list of envs).
          env_kind, n, kwargs: as for :func:`make_envs`.
        """
        self.start((server_kind, env_kind, n, kwargs))
        return self._children[self._key(server_kind, env_kind, n, **kwargs)].address()

    def close(self) -> None:
        while self._children:
            self._children.popitem()[1].stop()

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def rlmesh_model(
    forward: Callable[[np.ndarray], np.ndarray],
    name: str,
    one: Callable[[np.ndarray], Any],
    many: Callable[[np.ndarray], np.ndarray],
):
    """An ``rlmesh.numpy.Model`` named ``name`` running the numpy ``forward``
    (``[B, *obs] -> [B, *action]``), or ``(None, why)`` without rlmesh.

    ``one`` turns one row of ``forward``'s output into the action rlmesh's
    ``predict`` returns, ``many`` a batch into ``predict_batch``'s.
    """
    try:
        import rlmesh
        import rlmesh.numpy
    except ImportError as e:
        return None, f"rlmesh not importable ({e}): pip install 'jaxmesh[peer]'"

    def predict(self, obs):
        return one(forward(np.asarray(obs)[None])[0])

    def predict_batch(self, obs):
        return many(forward(np.asarray(obs)))

    cls = type(
        name,
        (rlmesh.numpy.Model,),
        {
            "workflow_edition": RLMESH_EDITION,
            "predict": predict,
            "predict_batch": predict_batch,
        },
    )
    return cls(), f"rlmesh {getattr(rlmesh, '__version__', '?')}"


def grpc_target(address: str) -> str:
    """A server address as ``jaxmesh.evaluate`` takes it: ``grpc://host:port``."""
    for prefix in ("grpc://", "tcp://", "dns:///", "ipv4:"):
        if address.startswith(prefix):
            address = address[len(prefix) :]
    return "grpc://" + address
