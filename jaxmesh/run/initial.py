"""JAX envs' initial states, ``Starts(initial_states=)`` or ``Starts(reset_fn=)``
(docs/evaluation.md, "Initial states (JAX envs)"), checked by shape only."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh.adapt import host_array, signature
from jaxmesh.core.carry import TrialReset
from jaxmesh.run import identity

#: The largest trial index (trial indices are int32 in the compiled program).
MAX_TRIAL = 2**31 - 1


@dataclasses.dataclass(frozen=True, eq=False)
class Trials:
    """Checked initial states: ``(obs, state)`` stacked in numpy, or ``reset_fn``."""

    states: Any = None
    reset_fn: Callable | None = None

    @property
    def count(self) -> int | None:
        """T, the states given (None for a ``reset_fn``: any trial index)."""
        if self.states is None:
            return None
        return int(jax.tree.leaves(self.states)[0].shape[0])

    @property
    def key(self) -> tuple:
        """What the program depends on: the states' shapes, or the function."""
        if self.states is None:
            return ("reset_fn", id(self.reset_fn))
        return ("initial_states", *signature(self.states))

    def engine_reset(self, env: Any) -> TrialReset:
        """The engine's reset from a trial index, checked against ``env.reset``."""
        key, fn = jax.ShapeDtypeStruct((2,), jnp.uint32), self.reset_fn
        want = jax.eval_shape(env.reset, key)
        name = getattr(env, "name", type(env).__name__)
        if self.states is None:
            try:
                got = jax.eval_shape(fn, key, jax.ShapeDtypeStruct((), jnp.int32))
            except Exception as e:
                raise TypeError(
                    f"reset_fn={_name(fn)}: calling it on one lane's key (uint32[2]) "
                    "and trial index (int32 scalar), inside jit, failed: "
                    f"{type(e).__name__}: {e}. It must be a JAX function "
                    "reset_fn(key, trial) -> (obs, state)"
                ) from e
            _check_like(got, want, "reset_fn(key, trial)", name, "return")
            return TrialReset(functools.partial(_call_reset_fn, fn))
        spec = lambda k: jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape[k:], x.dtype), self.states
        )  # k = 1: one state's
        _check_like(spec(1), want, "initial_states", name, "hold")
        return TrialReset(_take_state, spec(0))


def _take_state(key: jax.Array, trial: jax.Array, states: Any) -> Any:
    del key
    return jax.tree.map(lambda x: x[trial], states)


def _call_reset_fn(fn: Callable, key: jax.Array, trial: jax.Array, data: Any) -> Any:
    del data
    return fn(key, trial)


def _check_like(got: Any, want: Any, what: str, env: str, verb: str) -> None:
    s_got, s_want = jax.tree.structure(got), jax.tree.structure(want)
    if s_got != s_want:
        raise TypeError(
            f"{what} must {verb} what env {env!r}'s reset returns, (obs, state) "
            f"with structure {s_want}; got {s_got}. Build it from the env's own "
            "reset (jaxmesh.make_env(env).reset(key)) and change the values only"
        )
    paths = jax.tree_util.tree_leaves_with_path(want)
    for (path, w), g in zip(paths, jax.tree.leaves(got), strict=True):
        if tuple(g.shape) != tuple(w.shape) or jnp.dtype(g.dtype) != jnp.dtype(w.dtype):
            where = jax.tree_util.keystr(path)
            raise TypeError(
                f"{what}: leaf {where} is {jnp.dtype(g.dtype)}{list(g.shape)} per "
                f"episode; env {env!r}'s reset gives {jnp.dtype(w.dtype)}"
                f"{list(w.shape)}. Give it that shape and dtype"
            )


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _check_reset_fn(fn: Any) -> None:
    if not callable(fn):
        raise TypeError(
            f"reset_fn={fn!r}: expected a function reset_fn(key, trial) -> (obs, state)"
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: traced later
        return
    try:
        sig.bind(None, None)
    except TypeError as e:
        raise TypeError(
            f"reset_fn={_name(fn)}{sig}: expected a function of two arguments, "
            f"reset_fn(key, trial) -> (obs, state) ({e})"
        ) from e


def _stack(states: list) -> Any:
    """T ``(obs, state)`` pairs as one pytree of leaves [T, ...]."""
    if not states:
        raise ValueError(
            "initial_states=[]: expected at least one (obs, state) pair, as the "
            "env's reset returns it"
        )
    first = jax.tree.structure(states[0])
    for i, s in enumerate(states):
        if jax.tree.structure(s) != first:
            raise TypeError(
                f"initial_states[{i}] has structure {jax.tree.structure(s)}; "
                f"initial_states[0] has {first}: every entry must be (obs, state) "
                "as the env's reset returns it"
            )
    try:
        return jax.tree.map(
            lambda *xs: host_array(np.stack([host_array(x) for x in xs])), *states
        )
    except ValueError as e:
        raise ValueError(
            f"initial_states: the entries' leaves differ in shape ({e}); every "
            "entry must have the shapes of the env's reset output"
        ) from e


def resolve(initial_states: Any, reset_fn: Any) -> Trials | None:
    """``Starts``' ``initial_states`` or ``reset_fn`` as a ``Trials``, or None."""
    if initial_states is None and reset_fn is None:
        return None
    if reset_fn is not None:
        _check_reset_fn(reset_fn)
        return Trials(reset_fn=reset_fn)
    if isinstance(initial_states, list):
        states = _stack(initial_states)
    else:
        states = jax.tree.map(host_array, initial_states)
    paths = jax.tree_util.tree_leaves_with_path(states)
    if not paths:
        raise ValueError(
            f"initial_states={initial_states!r}: no arrays; expected (obs, state) "
            "as the env's reset returns it, every leaf with a leading axis T"
        )
    axes = {jax.tree_util.keystr(p): (x.shape[:1] or (None,))[0] for p, x in paths}
    if len(set(axes.values())) != 1 or None in axes.values():
        shown = ", ".join(f"{k}: {v}" for k, v in list(axes.items())[:6])
        raise ValueError(
            f"initial_states: every leaf needs the same leading axis T (one entry "
            f"per initial state); got leading axes {shown}. Stack T states of "
            "the env's reset output (jax.vmap(env.reset)(keys) has this form), "
            "or pass a list of (obs, state) pairs"
        )
    if next(iter(axes.values())) == 0:
        raise ValueError("initial_states: T = 0 states; give at least one")
    return Trials(states=states)


def run_trials(
    trials: Trials | None, states: Any, base: int, episodes: int
) -> tuple | None:
    """A run's ``(trial_of, data)`` for ``Engine.first_carry``, or None: each
    episode's trial index and the ``states`` its reset reads (None: ``trials``')."""
    if trials is None and states is not None:
        raise ValueError(
            "run(initial_states=...): this Evaluator was built without initial "
            "states (its program resets episodes from PRNGKey(seed)); build one "
            "with initial_states="
        )
    if trials is None:
        if base:
            raise ValueError(
                f"trial_index_base={base!r}: a JAX env's episodes start from "
                "PRNGKey(seed) unless you give initial states; pass "
                "initial_states= (T states, episode i starts from entry "
                "trial_index_base + i) or reset_fn=(key, trial) -> (obs, state), "
                "or drop trial_index_base="
            )
        return None
    data = () if trials.states is None else trials.states
    if states is not None:
        given = states if isinstance(states, Trials) else resolve(states, None)
        if trials.states is None or given.key != trials.key:
            built = (
                "a reset_fn"
                if trials.states is None
                else f"initial_states of {trials.count} states with these shapes"
            )
            raise ValueError(
                f"run(initial_states=...): {given.count} states of other shapes "
                f"than this Evaluator was built with ({built}); states with the "
                "same structure, shapes and dtypes run on the same program: "
                "build another Evaluator for these"
            )
        data = given.states
    trial_of = base + identity.episode_indices(episodes).astype(np.int64)
    top = int(trial_of.max()) if trial_of.size else base - 1
    count = trials.count
    if count is not None and top >= count:
        raise ValueError(
            f"initial_states holds {count} states (entries 0..{count - 1}), but "
            f"the run needs entry {top} (trial_index_base={base}, {episodes} "
            f"episodes: entries {base}..{top}); episodes never wrap around to "
            f"reuse a state: give at most {max(count - base, 0)} episodes, a lower "
            "trial_index_base, or more states"
        )
    if top > MAX_TRIAL:
        raise ValueError(
            f"trial_index_base={base}: trial indices reach {top}, above the "
            f"largest int32 ({MAX_TRIAL}); use a lower base"
        )
    return trial_of.astype(np.int32), data


def refuse_host(initial_states: Any, reset_fn: Any, label: str) -> None:
    """Refuses ``initial_states`` / ``reset_fn`` for host-stepped and served envs."""
    for given, value in (("initial_states", initial_states), ("reset_fn", reset_fn)):
        if value is not None:
            raise ValueError(
                f"{given}= with env {label!r}: initial states are given this way to "
                "JAX envs only; a host-stepped or served env picks its initial "
                'state from the trial index itself: list "trial_index" in '
                "env.metadata['reset_options'] and read options['trial_index'] in "
                f"reset (episode i gets trial_index_base + i), and drop {given}="
            )
