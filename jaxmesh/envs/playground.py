"""Adapter for MuJoCo Playground (MJX) envs, stepped in the jitted loop, with
per-episode domain randomization drawn from ``fold_in(PRNGKey(seed),
RANDOMIZE_STREAM)``: an episode's physics depend on its seed only
(docs/playground.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh.envs.brax import StepWithInfo, positive_int
from jaxmesh.envs.names import check_id, did_you_mean, need
from jaxmesh.envs.timing import step_seconds

#: For a config without ``episode_length`` (Playground's training default).
DEFAULT_EPISODE_LENGTH = 1000

#: The randomizer's key stream, apart from the engine's
#: (``jaxmesh.core.agent.STREAM_*``).
RANDOMIZE_STREAM = 7

INFO_PREFIX = "info"  # Playground's ``state.info``: ``"info/<key>"``
MODEL_PREFIX = "model"  # drawn model values: ``"model/<field>[/<index>...]"``
#: A Playground metric reported as ``"success"`` (True when above 0.5).
SUCCESS_METRIC = "reward/success"

#: The mjx Data fields Playground's renderer (``mjx_env.render_array``) sets.
RENDER_FIELDS = ("qpos", "qvel", "mocap_pos", "mocap_quat", "xfrc_applied")

#: Config keys set unless the user does: MJX's JAX implementation runs in any
#: jitted program.
DEFAULT_OVERRIDES = {"impl": "jax"}


@dataclasses.dataclass(eq=False)
class PlaygroundEnv(StepWithInfo):
    """A MuJoCo Playground ``MjxEnv`` as a jaxmesh single-lane env.

    Attributes:
      episode_length: env steps before ``truncated`` (None: no limit); default:
        the env config's, else 1000.
      action_repeat: env steps per action (default: the config's, else 1):
        rewards add up, as in Playground's training wrappers.
      randomize: ``fn(mjx_model, key) -> mjx_model``, drawn at every reset.
    """

    env: Any
    episode_length: int | None = None
    action_repeat: int | None = None
    randomize: Callable[[Any, jax.Array], Any] | None = None
    name: str = ""

    def __post_init__(self):
        cfg = getattr(self.env, "_config", None)
        if self.episode_length is None:
            self.episode_length = _config_get(
                cfg, "episode_length", DEFAULT_EPISODE_LENGTH
            )
        if self.episode_length is not None:
            self.episode_length = positive_int("episode_length", self.episode_length)
        if self.action_repeat is None:
            self.action_repeat = _config_get(cfg, "action_repeat", 1)
        self.action_repeat = positive_int("action_repeat", self.action_repeat)
        if not self.name:
            self.name = f"playground:{type(self.env.unwrapped).__name__}"
        self.num_actions = None
        self.action_shape = (int(self.env.action_size),)
        self.action_dtype = jnp.dtype(jnp.float32)
        self._changed: tuple[bool, ...] = ()
        if self.randomize is not None:
            self._changed = _changed_leaves(self.env, self.randomize, self.name)

    @property
    def limit(self) -> int | None:
        """Adapter steps before ``truncated`` (None: no limit)."""
        if self.episode_length is None:
            return None
        return math.ceil(self.episode_length / self.action_repeat)

    @property
    def dt(self) -> float | None:
        """Simulated seconds per adapter step (``dt`` times ``action_repeat``)."""
        dt = step_seconds(self.env)
        return None if dt is None else dt * self.action_repeat

    @contextlib.contextmanager
    def _with_model(self, drawn: tuple):
        """The env with a lane's drawn leaves in its model, as Playground's
        BraxDomainRandomizationVmapWrapper swaps them."""
        if not drawn:
            yield self.env
            return
        inner = self.env.unwrapped
        base, treedef = jax.tree.flatten(self.env.mjx_model)
        it = iter(drawn)
        changed = zip(base, self._changed, strict=True)
        old = inner._mjx_model
        inner._mjx_model = jax.tree.unflatten(
            treedef, [next(it) if c else x for x, c in changed]
        )
        try:
            yield self.env
        finally:
            inner._mjx_model = old

    def reset(self, key: jax.Array):
        return self._jitted[0](key)

    def step_with_info(self, key: jax.Array, state: Any, action: jax.Array):
        """``step`` and an info dict: ``state.metrics``, ``"info/"``, ``"model/"``
        and ``"success"`` (docs/playground.md lists them)."""
        del key
        return self._jitted[1](state, action)

    @functools.cached_property
    def _jitted(self) -> tuple[Callable, Callable]:
        # MJX traces slowly and a run traces several times (shape probes, the
        # program): under jit each signature is traced once.
        return jax.jit(self._reset), jax.jit(self._step)

    def _reset(self, key: jax.Array):
        drawn = ()
        if self.randomize is not None:  # the model leaves it changes
            key_r = jax.random.fold_in(key, RANDOMIZE_STREAM)
            model = self.randomize(self.env.mjx_model, key_r)
            leaves = zip(jax.tree.leaves(model), self._changed, strict=True)
            drawn = tuple(x for x, c in leaves if c)
        with self._with_model(drawn) as env:
            state = env.reset(key)
        return state.obs, (state, jnp.int32(0), drawn)

    def _step(self, state: Any, action: jax.Array):
        pstate, t, drawn = state
        with self._with_model(drawn) as env:
            if self.action_repeat == 1:
                pstate = env.step(pstate, action)
            else:
                pstate = _repeat(env, pstate, action, self.action_repeat)
        t = t + 1
        terminated = jnp.asarray(pstate.done, jnp.float32) > 0.5
        truncated = jnp.zeros((), bool) if self.limit is None else t >= self.limit
        reward = jnp.asarray(pstate.reward, jnp.float32)
        info = self._info(pstate, drawn)
        return pstate.obs, (pstate, t, drawn), reward, terminated, truncated, info

    def _info(self, pstate: Any, drawn: tuple) -> dict:
        info = dict(pstate.metrics)
        info[INFO_PREFIX] = dict(pstate.info)
        if SUCCESS_METRIC in pstate.metrics:
            info["success"] = jnp.asarray(pstate.metrics[SUCCESS_METRIC]) > 0.5
        if drawn:
            info[MODEL_PREFIX] = self.drawn_values(drawn)
        return info

    def render_state(self, state: Any) -> dict:
        """The ``RENDER_FIELDS`` of a lane's state (``Record.states`` keeps them)."""
        data = state[0].data
        return {k: getattr(data, k) for k in RENDER_FIELDS}

    def drawn_values(self, drawn: tuple) -> dict:
        """A lane's drawn model values as flat scalars (``"body_mass/1"``)."""
        paths = jax.tree_util.tree_flatten_with_path(self.env.mjx_model)[0]
        names = [
            jax.tree_util.keystr(p, simple=True, separator="/")
            for (p, _), c in zip(paths, self._changed, strict=True)
            if c
        ]
        out = {}
        for name, leaf in zip(names, drawn, strict=True):
            leaf = jnp.asarray(leaf)
            if leaf.ndim == 0:
                out[name] = leaf
                continue
            for idx in itertools.product(*map(range, leaf.shape)):
                out["/".join([name, *map(str, idx)])] = leaf[idx]
        return out


def _repeat(env: Any, state: Any, action: jax.Array, n: int) -> Any:
    """``n`` env steps with one action, rewards summed (brax's ``EpisodeWrapper``)."""

    def one(s, _):
        s = env.step(s, action)
        return s, s.reward

    state, rewards = jax.lax.scan(one, state, (), n)
    return state.replace(reward=jnp.sum(rewards, axis=0))


def _changed_leaves(env: Any, fn: Callable, name: str) -> tuple[bool, ...]:
    """Which model leaves ``fn`` replaces; TypeError for another structure,
    shape or dtype."""
    model = env.mjx_model
    changed: list[bool] = []

    def probe(model, key):
        out = fn(model, key)
        ins, outs = jax.tree.leaves(model), jax.tree.leaves(out)
        same = jax.tree.structure(out) == jax.tree.structure(model)
        if not same:
            raise TypeError(
                f"randomize={_fn_name(fn)} on env {name!r} returned "
                f"{type(out).__name__} of another structure than the env's "
                "mjx.Model; it must return the model with some fields replaced "
                "(model.replace(body_mass=...))"
            )
        for i, o in zip(ins, outs, strict=True):
            if (jnp.shape(i), jnp.result_type(i)) != (jnp.shape(o), jnp.result_type(o)):
                raise TypeError(
                    f"randomize={_fn_name(fn)} on env {name!r} changed a model "
                    f"leaf from {jnp.result_type(i)}{list(jnp.shape(i))} to "
                    f"{jnp.result_type(o)}{list(jnp.shape(o))}; keep each field's "
                    "shape and dtype"
                )
        changed[:] = [o is not i for i, o in zip(ins, outs, strict=True)]
        return out

    jax.eval_shape(probe, model, jax.ShapeDtypeStruct((2,), jnp.uint32))
    return tuple(changed)


def randomized(env: Any, fn: Any) -> PlaygroundEnv:
    """``env`` (a ``PlaygroundEnv``) with its model drawn per episode by
    ``fn(mjx_model, key) -> mjx_model``; TypeError for another env or ``fn``."""
    if not callable(fn):
        raise TypeError(
            f"randomize={fn!r}: expected a function fn(mjx_model, key) -> "
            "mjx_model (e.g. lambda m, k: m.replace(body_mass=m.body_mass * "
            "jax.random.uniform(k, (), minval=0.8, maxval=1.2)))"
        )
    if not isinstance(env, PlaygroundEnv):
        raise TypeError(not_playground(getattr(env, "name", type(env).__name__)))
    if env.randomize is not None:
        raise TypeError(
            f"randomize={_fn_name(fn)}: env {env.name!r} already has "
            f"randomize={_fn_name(env.randomize)}; give one randomizer (compose "
            "them in one function)"
        )
    return dataclasses.replace(
        env, randomize=fn, name=f"{env.name}+randomize:{_fn_name(fn)}"
    )


def not_playground(label: str) -> str:
    return (
        f"randomize= is for MuJoCo Playground envs (it replaces fields of the "
        f"env's mjx.Model); env {label!r} is not one: pass 'playground:<name>' "
        "or a Playground env object (mujoco_playground.registry.load(name)), or "
        "drop randomize="
    )


def from_registry_randomizer(fn: Callable) -> Callable:
    """A registry randomizer (``registry.get_domain_randomizer(name)``: keys
    -> ``(batched_model, in_axes)``) as a per-episode one (one key, one model)."""

    def one(model: Any, key: jax.Array) -> Any:
        batched, in_axes = fn(model, key[None])
        return jax.tree.map(
            lambda x, ax, m: m if ax is None else jnp.take(x, 0, axis=ax),
            batched,
            in_axes,
            model,
            is_leaf=lambda x: x is None,
        )

    one.__name__ = getattr(fn, "__name__", "randomizer")
    return one


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))


def make(
    env_id: str,
    *,
    config_overrides: dict | None = None,
    config: Any = None,
    episode_length: int | None = None,
    randomize: Callable | None = None,
    menagerie: str | os.PathLike | None = None,
) -> PlaygroundEnv:
    """A registered Playground env (``"CartpoleBalance"``) as a ``PlaygroundEnv``.

    Args:
      config_overrides: config keys to set (dotted for nested ones);
        ``impl`` is ``"jax"`` unless given.
      config: a full ``ml_collections.ConfigDict`` instead of the default one.
      menagerie: a MuJoCo Menagerie checkout for the locomotion and
        manipulation envs (``menagerie_for``).

    Raises:
      ValueError: an unknown name (naming the closest ones) or config key.
      FileNotFoundError: the env needs Menagerie and no checkout is found.
      ImportError: Playground is not installed.
    """
    playground = need("mujoco_playground", env_id, "playground", "MuJoCo Playground")
    registry = playground.registry
    how = "mujoco_playground.registry.ALL_ENVS lists them"
    check_id("Playground env", env_id, registry.ALL_ENVS, how)
    if config_overrides is not None and not hasattr(config_overrides, "items"):
        raise TypeError(
            f"config_overrides={config_overrides!r}: expected a mapping of "
            "Playground config keys to values, e.g. {'episode_length': 200}"
        )
    if config is None:
        config = registry.get_default_config(env_id)
    known = set(_flat_keys(config))
    defaults = {k: v for k, v in DEFAULT_OVERRIDES.items() if k in known}
    overrides = {**defaults, **dict(config_overrides or {})}
    unknown = sorted(k for k in overrides if k not in known)
    if unknown:
        hint = did_you_mean(unknown[0], known)
        raise ValueError(
            f"config_overrides {unknown} for Playground env {env_id!r}: not keys "
            f"of its config{'; ' + hint if hint else ''} (its keys: "
            f"{', '.join(sorted(known))})"
        )
    with menagerie_for(env_id, menagerie) as root:
        try:
            env = registry.load(env_id, config=config, config_overrides=overrides)
        except Exception as e:
            hint = ""
            if root is not None:
                hint = (
                    f"; its robot is read from the MuJoCo Menagerie checkout {root}:"
                    f" it needs that robot's folder there, at commit "
                    f"{menagerie_commit()} (the one this Playground is written "
                    "against)"
                )
            raise ValueError(
                f"Playground env {env_id!r} failed to load: {e}{hint}"
            ) from e
    out = PlaygroundEnv(env, episode_length=episode_length, name=f"playground:{env_id}")
    return out if randomize is None else randomized(out, randomize)


def _flat_keys(config: Any, prefix: str = "") -> list[str]:
    keys = []
    for k, v in config.items():
        keys.append(prefix + k)
        if hasattr(v, "items"):
            keys += _flat_keys(v, f"{prefix}{k}.")
    return keys


def _config_get(cfg: Any, key: str, default: Any) -> Any:
    try:
        return cfg[key] if cfg is not None and key in cfg else default
    except TypeError:
        return default


#: The variable naming a Menagerie checkout (the ``mujoco-menagerie`` package's).
MENAGERIE_ENV = "MENAGERIE_ROOT"
MENAGERIE_REPO = "https://github.com/google-deepmind/mujoco_menagerie"


def needs_menagerie(env_id: str) -> bool:
    """Whether ``env_id`` loads its robot from Menagerie (locomotion and
    manipulation envs)."""
    from mujoco_playground import registry

    return env_id in registry.locomotion.ALL_ENVS or env_id in (
        registry.manipulation.ALL_ENVS
    )


def _mjx_env() -> Any:
    from mujoco_playground._src import mjx_env

    return mjx_env


def menagerie_folder() -> pathlib.Path:
    """Where Playground reads Menagerie from unless told otherwise."""
    return pathlib.Path(_mjx_env().MENAGERIE_PATH)


def menagerie_commit() -> str:
    """The Menagerie commit the installed Playground is written against."""
    return _mjx_env().MENAGERIE_COMMIT_SHA


@contextlib.contextmanager
def menagerie_for(env_id: str, path: str | os.PathLike | None = None):
    """Playground pointed at a Menagerie checkout (``path``, else
    ``$MENAGERIE_ROOT``, else its own copy, cloned when absent) while
    ``env_id`` is built; yields the folder (None: not needed). FileNotFoundError
    (saying how to get one): no such folder, or no copy and no clone."""
    if not needs_menagerie(env_id):
        yield None
        return
    mjx_env = _mjx_env()
    source = "menagerie="
    if path is None and os.environ.get(MENAGERIE_ENV):
        path, source = os.environ[MENAGERIE_ENV], f"${MENAGERIE_ENV}="
    if path is None:
        folder = menagerie_folder()
        if not folder.exists():
            try:
                mjx_env.ensure_menagerie_exists()
            except Exception as e:  # git missing or failing, a read-only install
                raise FileNotFoundError(
                    f"Playground env {env_id!r} needs MuJoCo Menagerie's robot "
                    f"files: Playground reads them from {folder}, which does not "
                    f"exist, and its git clone of {MENAGERIE_REPO} there failed "
                    f"({type(e).__name__}: {e}). {_menagerie_fix()}"
                ) from e
        yield folder
        return
    root = pathlib.Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{source}{str(path)!r}: no such folder; Playground env {env_id!r} "
            "needs a MuJoCo Menagerie checkout there (the folder holding "
            f"unitree_go1/, franka_emika_panda/, ...). {_menagerie_fix()}"
        )
    old = mjx_env.MENAGERIE_PATH
    # The path class Playground uses (etils' epath.Path), not imported.
    mjx_env.MENAGERIE_PATH = type(old)(root)
    try:
        yield root
    finally:
        mjx_env.MENAGERIE_PATH = old


def _menagerie_fix() -> str:
    return (
        "On a machine with network access: git clone "
        f"{MENAGERIE_REPO} && git -C mujoco_menagerie checkout "
        f"{menagerie_commit()} (the commit this Playground is written "
        "against), copy the folder to this machine and pass it: "
        "make_env('playground:<name>', menagerie='/path/to/mujoco_menagerie') "
        f"(env_config: {{menagerie: ...}} in a config) or set "
        f"{MENAGERIE_ENV}=/path/to/mujoco_menagerie. The pip package "
        "mujoco-menagerie holds no robot files: it downloads them from GitHub "
        "when first used."
    )
