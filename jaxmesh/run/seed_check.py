"""Does an env honour its seed? ``check_seeds`` finds out before a run
(docs/evaluation.md, "Envs that ignore their seed")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.envs import make_env
from jaxmesh.envs.gymnasium.batch import TRIAL_INDEX
from jaxmesh.envs.gymnasium.lanes import (
    declares_trial_index,
    env_name,
    idle_action,
    import_gymnasium,
    make_envs,
)
from jaxmesh.remote.address import require_grpc
from jaxmesh.run.backend import HOST, SERVED, backend_of
from jaxmesh.run.checks import check_int

#: Env steps compared after each reset.
DEFAULT_STEPS = 5


class SeedReport(NamedTuple):
    """What ``check_seeds`` found.

    Attributes:
      reproducible: two resets with the same seed (and the same actions after
        them) gave identical observations, rewards and episode ends.
      seed_sensitive: a reset with the other seed gave something different
        (False: the env may ignore its seed, or be deterministic).
      message: one line for a person: the env, the seeds, what was compared
        and, for a failed check, what differed first.
    """

    reproducible: bool
    seed_sensitive: bool
    message: str


def _gap(a: Any, b: Any) -> str | None:
    """None for equal observations, else how they differ ("" when unsaid)."""
    la, lb = ([np.asarray(x) for x in jax.tree.leaves(t)] for t in (a, b))
    if len(la) != len(lb):
        return ""
    pairs = list(zip(la, lb, strict=True))
    if all(
        x.shape == y.shape
        and x.dtype == y.dtype
        and np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
        for x, y in pairs
    ):
        return None
    for x, y in pairs:
        if x.shape != y.shape:
            return f" (shapes {x.shape} and {y.shape})"
        if x.dtype.kind in "biuf" and y.dtype.kind in "biuf":
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
            if diff.size and np.nanmax(diff) > 0:
                return f" (largest difference {float(np.nanmax(diff)):.6g})"
    return ""


def _first_difference(a: list, b: list) -> str | None:
    """Where two ``_trace``s first differ, or None."""
    if (gap := _gap(a[0], b[0])) is not None:
        return "the reset observation" + gap
    for t, (x, y) in enumerate(zip(a[1:], b[1:], strict=False), 1):
        if (gap := _gap(x[0], y[0])) is not None:
            return f"the observation after step {t}{gap}"
        if x[1] != y[1]:
            return f"the reward of step {t} ({x[1]!r} and {y[1]!r})"
        if x[2] != y[2]:
            return f"terminated/truncated at step {t} ({x[2]} and {y[2]})"
    if len(a) != len(b):
        return f"the episode's length (one ended after {min(len(a), len(b)) - 1} steps)"
    return None


def _trace(obs: Any, step: Callable[[int], tuple], steps: int) -> list:
    """``obs``, then ``(obs, reward, (terminated, truncated))`` of each step."""
    out = [obs]
    for t in range(steps):
        obs, reward, terminated, truncated = step(t)
        out.append((obs, float(reward), (bool(terminated), bool(truncated))))
        if out[-1][2] != (False, False):
            break
    return out


def _traces(env: Any, is_jax: bool, seeds: tuple[int, ...], steps: int) -> tuple:
    """Each seed's ``_trace``, and the fixed action in words."""
    if is_jax:
        action = jnp.zeros(tuple(env.action_shape), env.action_dtype)
        reset, step = jax.jit(env.reset), jax.jit(env.step)

        def start(seed: int) -> tuple:
            key = jax.random.PRNGKey(seed)
            obs, state = reset(key)
            held = [state]

            def one(t: int) -> tuple:
                obs, held[0], *ends = step(jax.random.fold_in(key, t), held[0], action)
                return (jax.device_get(obs), *ends)

            return jax.device_get(obs), one

    else:
        action = idle_action(env.action_space)
        metadata = getattr(env, "metadata", None)
        options = {TRIAL_INDEX: 0} if declares_trial_index(metadata) else None
        start = lambda seed: (
            env.reset(seed=seed, options=options)[0],
            lambda t: env.step(action)[:4],
        )
    a = np.asarray(jax.device_get(action))
    text = f"action {a.item()!r}" if a.ndim == 0 else f"the action {a.tolist()!r}"
    return tuple(_trace(*start(seed), steps) for seed in seeds), text


def _resolve(env: Any, token: Any, credentials: Any) -> tuple[Any, str, Any, bool]:
    """(the env to check, its name, what to close after, whether it is JAX)."""
    kind = backend_of(env)
    if kind == SERVED:
        if not isinstance(env, str):
            raise TypeError(
                f"env={env!r}: check one server at a time, e.g. "
                "check_seeds('grpc://host:port')"
            )
        require_grpc()
        from jaxmesh.remote.envs import RemoteEnv  # the [remote] extra

        remote = RemoteEnv(env, token=token, credentials=credentials)
        return remote, f"{remote.env_name} at {env}", remote, False
    if token is not None or credentials is not None:
        raise ValueError(
            "check_seeds(token=..., credentials=...): these are for a served env "
            f"('grpc://host:port'); env {env!r} runs in this process"
        )
    if kind == HOST:
        gym = import_gymnasium()
        if isinstance(env, str):
            (made,) = make_envs(env, 1)
            return made, env, made, False
        if isinstance(env, list):
            if not env:
                raise ValueError("env=[]: pass a gymnasium Env")
            env = env[0]  # the lanes' first env
        if isinstance(env, gym.vector.VectorEnv):
            inner = getattr(env, "envs", None)  # SyncVectorEnv holds its envs
            if not inner:
                raise TypeError(
                    f"env {type(env).__name__}: check_seeds resets one env, and "
                    "this VectorEnv does not hold its envs in this process; check "
                    "one env made like them: check_seeds(gymnasium.make(id))"
                )
            env = inner[0]
        return env, env_name(env), None, False
    made = make_env(env)
    return made, getattr(made, "name", type(made).__name__), None, True


def check_seeds(
    env: Any,
    seed: int = 0,
    other: int = 1,
    *,
    steps: int = DEFAULT_STEPS,
    token: str | None = None,
    credentials: Any = None,
) -> SeedReport:
    """Checks that ``env`` is reproducible from its seed, and depends on it:
    resets it twice with ``seed`` and once with ``other``, steps each ``steps``
    times with one fixed action, and compares what came back.

    Args:
      env: a gymnasium ``Env`` (a list of them: the first; a ``SyncVectorEnv``:
        its first env), ``"gymnasium:<id>"`` (made, checked and closed),
        ``"grpc://host:port"`` (lane 0 of that server, through
        ``jaxmesh.RemoteEnv``; the server must be free), or a JAX env (an id
        such as ``"gymnax:CartPole-v1"``, or anything ``jaxmesh.make_env``
        takes).
      seed: the seed reset with twice.
      other: the seed compared with it (must differ from ``seed``).
      steps: env steps compared after each reset (0: only the reset
        observation).
      token, credentials: for a served env, as for ``jaxmesh.RemoteEnv``.

    Returns:
      A ``SeedReport``. The env passed in is left reset and stepped; an env
      made here (an id, a server's session) is closed.

    Raises:
      ValueError, TypeError: bad arguments, an unknown id, or an env that
        cannot be reset or stepped as checked.
      jaxmesh.RemoteConnectionError: a served env cannot be reached.
    """
    for name, value in (("seed", seed), ("other", other), ("steps", steps)):
        check_int(name, value, 0, "check_seeds' seeds and env steps")
    if seed == other:
        raise ValueError(
            f"seed={seed} and other={other}: give two different seeds, so that "
            "the check can tell whether the seed changes anything"
        )
    target, name, owned, is_jax = _resolve(env, token, credentials)
    try:
        seeds = (int(seed), int(seed), int(other))
        traces, action = _traces(target, is_jax, seeds, int(steps))
    finally:
        if owned is not None:
            owned.close()
    first, again, moved = traces
    compared = "reset observation"
    if steps:
        compared += f" and {len(first) - 1} step(s) of {action}"
    same_seed = _first_difference(first, again)
    other_seed = _first_difference(first, moved)
    reproducible, sensitive = same_seed is None, other_seed is not None
    if not reproducible:
        # The other seed's result says nothing then: the same seed differs too.
        text = (
            f"env {name} is not reproducible: two resets with seed {seed} differed "
            f"in {same_seed}; its episodes would differ from run to run (an env "
            "that ignores its seed: see docs/evaluation.md, 'Envs that ignore "
            "their seed')"
        )
    elif sensitive:
        text = (
            f"env {name} is reproducible and seed-sensitive: two resets with seed "
            f"{seed} gave the same {compared}, and seed {other} differed in "
            f"{other_seed}"
        )
    else:
        text = (
            f"env {name} is reproducible but not seed-sensitive: seeds {seed} and "
            f"{other} gave the same {compared}; the env may ignore its seed (or "
            "not depend on it this early: check more steps)"
        )
    return SeedReport(reproducible, sensitive, text)


def require_reproducible(env: Any, what: str = "check_seeds=True") -> SeedReport:
    """``check_seeds(env)`` for ``Starts(check_seeds=True)``, refusing a failure."""
    try:
        report = check_seeds(env)
    except TypeError as e:
        raise ValueError(f"{what}: {e}") from e
    if not report.reproducible:
        raise ValueError(
            f"{what}: {report.message}. Fix the env's reset(seed=...), or run "
            "without check_seeds knowing that its results will not repeat"
        )
    return report
