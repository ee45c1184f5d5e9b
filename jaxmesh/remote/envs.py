"""Served envs as gymnasium envs: ``RemoteEnv`` (one lane) and ``RemoteVectorEnv``,
each ``reset`` or ``step`` one round trip of a ``Session`` (docs/remote.md).
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from jaxmesh.remote.address import require_grpc

require_grpc()

from jaxmesh.envs.gymnasium.batch import TRIAL_INDEX  # noqa: E402
from jaxmesh.envs.gymnasium.lanes import closing_on_error  # noqa: E402
from jaxmesh.envs.gymnasium.leaves import ObsLayout  # noqa: E402
from jaxmesh.errors import RemoteError  # noqa: E402
from jaxmesh.remote import codec, spaces  # noqa: E402
from jaxmesh.remote.client import DEFAULT_CONNECT_TIMEOUT  # noqa: E402
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb  # noqa: E402
from jaxmesh.remote.session import Session  # noqa: E402

__all__ = ["RemoteEnv", "RemoteVectorEnv", "ResetNeeded"]

RESET_MASK = "reset_mask"
#: ``reset()`` without a seed draws one in ``[0, SEED_BOUND)`` from ``np_random``.
SEED_BOUND = 2**31
_MAX_SEED = 2**63 - 1


class ResetNeeded(gymnasium.error.ResetNeeded, AssertionError):
    """A step of a lane never reset or whose episode ended (also the
    ``AssertionError`` gymnasium's ``SyncVectorEnv`` raises there)."""


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool | np.bool_)


def _seed(seed: Any, what: str = "seed") -> int | None:
    if seed is None:
        return None
    if not _is_int(seed) or not 0 <= int(seed) <= _MAX_SEED:
        raise ValueError(
            f"{what}={seed!r}: expected None or an int in [0, 2**63) (the server "
            "resets the env with env.reset(seed=...), which takes a non-negative "
            "int)"
        )
    return int(seed)


class _Client(Session):
    """A ``Session``, opened with a call of no lane (a busy server fails here),
    and what a gymnasium env needs of it: the spaces, checked actions and
    options, one call at a time."""

    def __init__(self, address: str, token, connect_timeout, reply_timeout, tls, lane):
        super().__init__(
            address,
            token=token,
            connect_timeout=connect_timeout,
            reply_timeout=reply_timeout,
            credentials=tls,
        )
        info = self.info
        self.env_name = info.env_name
        self.metadata: dict[str, Any] = {"render_modes": []}
        if self.trial_index:
            self.metadata["reset_options"] = (TRIAL_INDEX,)
        self.obs_space, self.act_space = self.rebuild(
            lambda: (
                spaces.observation_space(info.observation),
                spaces.leaf_space(info.action),
            )
        )
        self.layout = ObsLayout(self.obs_space, lambda s: (s.shape, s.dtype), "")
        self.discrete_leaves = {
            m.key for m in info.observation if m.space == spaces.DISCRETE
        }
        self.discrete = isinstance(self.act_space, gymnasium.spaces.Discrete)
        with closing_on_error([self]):
            if not _is_int(lane) or not 0 <= int(lane) < self.num_lanes:
                raise ValueError(
                    f"lane={lane!r}, but the server at {self.address} serves "
                    f"{self.num_lanes} lanes; expected an int in "
                    f"[0, {self.num_lanes - 1}]"
                )
            self.open()
            self.call(np.zeros(0, np.int64))

    def options(self, options: Any, vector: bool) -> dict[str, pb.Value]:
        """``RemoteEnv.reset``'s options as the wire's (``vector``:
        ``RemoteVectorEnv.reset``'s, its ``reset_mask`` left out)."""
        what = "RemoteVectorEnv.reset" if vector else "RemoteEnv.reset"
        if options is not None and not isinstance(options, Mapping):
            e_g = "{'reset_mask': mask}" if vector else "{'trial_index': 0}"
            raise TypeError(
                f"options is a {type(options).__name__}; expected None or a dict "
                f"such as {e_g}"
            )
        options = options or {}
        known = (TRIAL_INDEX, RESET_MASK) if vector else (TRIAL_INDEX,)
        unknown = sorted(str(k) for k in options if k not in known)
        declared = [TRIAL_INDEX] if self.trial_index else []
        if unknown:
            raise ValueError(
                f"{what}: options {unknown} are not supported; a served env takes "
                f"only the reset options it declares ({declared} for "
                f"{self.env_name} at {self.address}, see metadata['reset_options'])"
            )
        if TRIAL_INDEX not in options:
            return {}
        value = options[TRIAL_INDEX]
        if not self.trial_index:
            raise ValueError(
                f"{what}: options={{'trial_index': {value!r}}}, but {self.env_name} "
                f"at {self.address} does not declare the 'trial_index' reset "
                "option (metadata has no 'reset_options'); leave it out"
            )
        if not _is_int(value) or not -_MAX_SEED - 1 <= int(value) <= _MAX_SEED:
            raise ValueError(
                f"{what}: options['trial_index']={value!r}, expected an int (int64)"
            )
        return {TRIAL_INDEX: pb.Value(int_value=int(value))}

    def actions(self, actions: Any, lead: tuple[int, ...], what: str) -> np.ndarray:
        space = self.act_space
        arr = np.asarray(actions)
        want = lead + space.shape
        kinds = "iu" if self.discrete else "biuf"
        if arr.shape != want or arr.dtype.kind not in kinds:
            kind = "ints" if self.discrete else "numbers"
            raise ValueError(
                f"{what} {actions!r} has shape {arr.shape} and dtype {arr.dtype}; "
                f"expected {kind} of shape {want} for action space {space}"
            )
        if self.discrete:
            low, high = int(space.start), int(space.start + space.n)
            if arr.size and (arr.min() < low or arr.max() >= high):
                raise ValueError(
                    f"{what} {actions!r} is outside the action space {space}; "
                    f"expected ints in [{low}, {high - 1}]"
                )
            return arr.astype(np.int64)
        # A Box action travels in the space's own dtype (the server's contract).
        return arr.astype(space.dtype)

    def observation(self, batch: codec.ResultBatch, row: int) -> Any:
        leaves = {  # as a gymnasium env returns them (writable)
            k: np.int64(x[row]) if k in self.discrete_leaves else np.array(x[row])
            for k, x in batch.observation.items()
        }
        return self.layout.build(leaves)

    def check_open(self) -> _Client:
        if self.closed:
            raise gymnasium.error.ClosedEnvironmentError(
                f"the env served at {self.address} was closed; make a new one"
            )
        return self

    def call(self, named: np.ndarray, **request: Any) -> codec.ResultBatch:
        """One call and its reply, which must name the lanes ``named``."""
        self.check_open()
        self.send(**request)
        try:
            batch = self.receive().batch
        except codec.ProtocolError as exc:
            raise RemoteError(
                f"the jaxmesh env server at {self.address} sent a reply this client "
                f"cannot read: {exc}",
                address=self.address,
            ) from None
        if not np.array_equal(batch.lanes, named):
            raise RemoteError(
                f"the jaxmesh env server at {self.address} answered for lanes "
                f"{batch.lanes.tolist()[:16]}, expected lanes "
                f"{named.tolist()[:16]}; the server broke the protocol",
                address=self.address,
            )
        return batch

    def step_lanes(self, lanes: np.ndarray, actions: np.ndarray) -> codec.ResultBatch:
        ones = np.ones(lanes.size, np.int64)
        batch = self.call(lanes, lanes=lanes, counts=ones, actions=actions)
        if not np.all(batch.steps == 1):
            raise RemoteError(
                f"the jaxmesh env server at {self.address} executed "
                f"{batch.steps.tolist()[:16]} steps for lanes "
                f"{lanes.tolist()[:16]}, expected 1 each (it thinks an episode "
                "ended that this client did not see end)",
                address=self.address,
            )
        return batch

    def __del__(self):  # an env dropped without close() frees the server
        with contextlib.suppress(Exception):  # at interpreter exit anything goes
            self.close()


class RemoteEnv(gymnasium.Env):
    """One lane of a jaxmesh env server as a ``gymnasium.Env``, holding the
    server's one session until :meth:`close`.

    Args:
        address: ``"grpc://host:port"``, ``"grpcs://host:port"`` (TLS) or
            ``"host:port"``.
        lane: the server lane this env drives.
        token: the server's token (default: ``JAXMESH_TOKEN``).
        connect_timeout: seconds the handshake may take.
        reply_timeout: seconds a reply may take (None: no limit; keepalive
            pings still find a dead server).
        credentials: ``grpc.ChannelCredentials`` for a ``"grpcs://"`` server
            (None: gRPC's default roots).

    Raises:
        ValueError: a malformed address, or a lane the server does not have.
        jaxmesh.RemoteConnectionError: nothing answers, the token is refused,
            or the server is busy with another client.

    Example:
        >>> env = jaxmesh.RemoteEnv("grpc://127.0.0.1:5555")  # doctest: +SKIP
        >>> obs, info = env.reset(seed=3)  # doctest: +SKIP
    """

    def __init__(
        self,
        address: str,
        *,
        lane: int = 0,
        token: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        reply_timeout: float | None = None,
        credentials: Any = None,
    ):
        self._client = client = _Client(
            address, token, connect_timeout, reply_timeout, credentials, lane
        )
        self.lane = int(lane)
        self.address = client.address
        self.env_name = client.env_name
        self.observation_space = client.obs_space
        self.action_space = client.act_space
        self.metadata = dict(client.metadata)
        self._lanes = np.array([self.lane], np.int64)
        self._state = "new"  # or "running", or "ended" (terminated or truncated)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets the served lane: the env's ``reset(seed=..., options=...)``.

        Args:
            seed: the episode's seed; None: one drawn from ``np_random``.
            options: None, or ``{"trial_index": i}`` when the env declares it.

        Returns:
            ``(observation, {})``.

        Raises:
            ValueError: a bad seed or option.
            jaxmesh.RemoteError: the server or the env failed.
        """
        client = self._client.check_open()
        seed = _seed(seed)
        wire = client.options(options, vector=False)
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(SEED_BOUND))
        self._state = "new"
        batch = client.call(
            self._lanes, reset_lanes=self._lanes, seeds=[seed], options=wire
        )
        self._state = "running"
        return client.observation(batch, 0), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Steps the served lane with ``action``.

        Returns:
            ``(observation, reward, terminated, truncated, {})``.

        Raises:
            ResetNeeded: the env was never reset, or its episode ended.
            ValueError: an action not of the space's shape (or outside a
                Discrete space).
            jaxmesh.RemoteError: the server or the env failed.
        """
        client = self._client.check_open()
        if self._state != "running":
            why = (
                "was never reset"
                if self._state == "new"
                else "ended (terminated or truncated) and was not reset"
            )
            raise ResetNeeded(
                f"step() on {self}: the episode {why}; call reset() first"
            )
        arr = client.actions(action, (), "action")[None]
        batch = client.step_lanes(self._lanes, arr)
        terminated = bool(batch.terminated[0])
        truncated = bool(batch.truncated[0])
        if terminated or truncated:
            self._state = "ended"
        obs = client.observation(batch, 0)
        return obs, float(batch.rewards[0]), terminated, truncated, {}

    def render(self) -> None:
        """Nothing is rendered: a served env has ``render_mode`` None."""

    def close(self) -> None:
        """Ends the session (the server is free for the next client). Idempotent."""
        self._client.close()

    def __repr__(self) -> str:
        return f"RemoteEnv({self.env_name} at {self.address}, lane {self.lane})"

    __str__ = __repr__


class RemoteVectorEnv(VectorEnv):
    """Every lane of a jaxmesh env server as a gymnasium ``VectorEnv`` in
    ``AutoresetMode.DISABLED``: a lane whose episode ended is reset
    (``options={"reset_mask": mask}``) before the next ``step``.

    Args:
        address, token, connect_timeout, reply_timeout, credentials: as for
            :class:`RemoteEnv`.

    Raises:
        ValueError: a malformed address.
        jaxmesh.RemoteConnectionError: as for :class:`RemoteEnv`.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        reply_timeout: float | None = None,
        credentials: Any = None,
    ):
        self._client = client = _Client(
            address, token, connect_timeout, reply_timeout, credentials, 0
        )
        self.address = client.address
        self.env_name = client.env_name
        self.num_envs = client.num_lanes
        self.single_observation_space = client.obs_space
        self.single_action_space = client.act_space
        self.observation_space = batch_space(client.obs_space, self.num_envs)
        self.action_space = batch_space(client.act_space, self.num_envs)
        self.metadata = {**client.metadata, "autoreset_mode": AutoresetMode.DISABLED}
        self._obs = client.layout.empty((self.num_envs,))  # each lane's last, per leaf
        self._was_reset = np.zeros(self.num_envs, bool)
        self._ended = np.zeros(self.num_envs, bool)
        self._all = np.arange(self.num_envs, dtype=np.int64)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every lane, or the lanes of ``options["reset_mask"]``.

        Args:
            seed: None (drawn per lane), an int (lane i gets ``seed + i``), or
                one int or None per lane.
            options: None, or a dict with ``"reset_mask"`` (bool
                ``(num_envs,)``, at least one True) and ``"trial_index"``.

        Returns:
            ``(observations, {})``: every lane's observation.

        Raises:
            ValueError, TypeError: bad seeds, mask or options.
            jaxmesh.RemoteError: the server or the env failed.
        """
        client = self._client.check_open()
        n = self.num_envs
        if seed is None or _is_int(seed):
            first = _seed(seed)
            seeds = [None if first is None else first + i for i in range(n)]
            _seed(seeds[-1], "seed + lane")  # the largest
        elif isinstance(seed, Sequence) and not isinstance(seed, str):
            if len(seed) != n:
                raise ValueError(
                    f"seed is a list of {len(seed)} seeds; expected one per lane "
                    f"({n}), an int, or None"
                )
            seeds = [_seed(s, f"seed[{i}]") for i, s in enumerate(seed)]
        else:
            raise TypeError(
                f"seed is a {type(seed).__name__}; expected None, an int or a list "
                f"of {n} ints or Nones"
            )
        wire = client.options(options, vector=True)
        mask = None if options is None else options.get(RESET_MASK)
        if mask is None:
            lanes = self._all
        else:
            arr = np.asarray(mask)
            if arr.dtype != np.bool_ or arr.shape != (n,) or not arr.any():
                raise ValueError(
                    f"options['reset_mask'] is {arr.dtype}{list(arr.shape)} "
                    f"{arr.tolist()!r:.80}; expected a bool array of shape ({n},) "
                    "with at least one True (the lanes to reset)"
                )
            lanes = np.flatnonzero(arr).astype(np.int64)
        if _is_int(seed):
            super().reset(seed=int(seed))
        drawn = [
            int(self.np_random.integers(SEED_BOUND)) if seeds[j] is None else seeds[j]
            for j in lanes
        ]
        self._was_reset[lanes] = False
        batch = client.call(lanes, reset_lanes=lanes, seeds=drawn, options=wire)
        for k, x in self._obs.items():
            x[lanes] = batch.observation[k]
        self._was_reset[lanes] = True
        self._ended[lanes] = False
        return self._observations(), {}

    def step(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every lane with its action.

        Args:
            actions: ``(num_envs,) + single action shape``.

        Returns:
            ``(observations, rewards float64, terminated, truncated, {})``.

        Raises:
            ResetNeeded: a lane was never reset, or ended and was not reset.
            ValueError: actions of the wrong shape (or outside a Discrete space).
            jaxmesh.RemoteError: the server or the env failed.
        """
        client = self._client.check_open()
        if not self._was_reset.all():
            lanes = np.flatnonzero(~self._was_reset).tolist()
            raise ResetNeeded(
                f"step() on {self}: lanes {lanes[:16]} were never reset; call "
                "reset() first"
            )
        if self._ended.any():
            lanes = np.flatnonzero(self._ended).tolist()
            raise ResetNeeded(
                f"step() on {self}: the episodes of lanes {lanes[:16]} ended "
                "(terminated or truncated) on an earlier step and were not reset; "
                "in AutoresetMode.DISABLED reset them first: "
                "env.reset(options={'reset_mask': terminated | truncated})"
            )
        arr = client.actions(actions, (self.num_envs,), "actions")
        batch = client.step_lanes(self._all, arr)
        for k, x in self._obs.items():
            x[:] = batch.observation[k]
        terminated = np.array(batch.terminated, bool)
        truncated = np.array(batch.truncated, bool)
        self._ended = terminated | truncated
        rewards = np.array(batch.rewards, np.float64)
        return self._observations(), rewards, terminated, truncated, {}

    def _observations(self) -> Any:
        return self._client.layout.build({k: x.copy() for k, x in self._obs.items()})

    def close_extras(self, **kwargs: Any) -> None:
        """Ends the session (the server is free for the next client)."""
        self._client.close()

    def __repr__(self) -> str:
        return (
            f"RemoteVectorEnv({self.env_name} at {self.address}, "
            f"num_envs={self.num_envs})"
        )

    __str__ = __repr__
