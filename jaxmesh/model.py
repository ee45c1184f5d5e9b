"""``jaxmesh.Model``: a policy with up to four predict corners.

``predict`` (one lane, one action), ``predict_chunk`` (one lane, K actions),
``predict_batch`` and ``predict_chunk_batch`` (a batch of lanes): an author
implements any and the engine derives the rest (``Model.as_policy``). The
rules: docs/models.md.

Example::

    import jax.numpy as jnp
    import jaxmesh
    from jaxmesh.adapt import State

    class Chunker(jaxmesh.Model):
        native_chunk = 8

        def predict_chunk(self, obs):  # one lane -> 8 actions
            return jnp.full((8,), obs[2] > 0, jnp.int32)

    chunked = jaxmesh.evaluate(Chunker(), "gymnax:CartPole-v1", horizon=8, episodes=4)

    # With a spec, the function sees a dict of the declared inputs.
    lean = jaxmesh.Model(
        lambda inputs: (inputs["obs"][2] > 0).astype(jnp.int32),
        spec={"obs": State()},
        name="lean",
    )
    result = jaxmesh.evaluate(lean, "gymnax:CartPole-v1", episodes=4)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh import adapt
from jaxmesh.core.policy import (
    EXECUTION_HORIZON,
    Policy,
    _wrap_function,
    positional_arity,
    takes_param,
)
from jaxmesh.devices import check_device, resolve_device
from jaxmesh.explain import explain
from jaxmesh.params import Param, ParamError, _jsonable, params_schema, validate_config

CORNERS = ("predict", "predict_chunk", "predict_batch", "predict_chunk_batch")

#: Version of the ``describe()`` envelope; bumped when a field changes meaning.
DESCRIBE_SCHEMA_VERSION = 1


def _loads_first(fn: Callable) -> Callable:
    """Wraps a corner so that the model's ``load`` has run before it."""

    @functools.wraps(fn)
    def corner(self, *args, **kwargs):
        if not self._loaded:
            self._ensure_loaded()
        return fn(self, *args, **kwargs)

    corner._jaxmesh_loads_first = True  # type: ignore[attr-defined]
    return corner


class _Params:
    """``self.params``: the weights; the first read runs ``load`` if needed."""

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return objtype._class_params
        if not obj._loaded and not obj._loading:
            obj._ensure_loaded()
        return obj.__dict__.get("params", type(obj)._class_params)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["params"] = value


def _spec_to_dict(decl: Any) -> dict:
    d: dict[str, Any] = {"kind": type(decl).__name__}
    for field in dataclasses.fields(decl):
        if not field.init:  # a Text's encodings: state, not configuration
            continue
        v = getattr(decl, field.name)
        if callable(v):  # a Text's encode function: by name
            v = getattr(v, "__qualname__", type(v).__name__)
        elif field.name == "dtype":
            v = jnp.dtype(v).name
        elif isinstance(v, tuple):
            v = list(v)
        d[field.name] = v
    return d


def _put(tree: Any, device: jax.Device | None) -> Any:
    """``tree`` with every array leaf on ``device`` (None: as it is)."""
    if device is None or tree is None:
        return tree
    return jax.device_put(tree, device)


class Model:
    """Base class for authored policies, or a wrapper around a function.

    Subclass and implement any corner (``predict(self, obs)`` ...), reading
    weights from ``self.params`` (traced within a corner call); put heavy work
    in ``load(self, **config)``, run once before the first predict; declare
    configuration with ``jaxmesh.Param`` and build with ``from_config``. A
    subclass's ``__init__`` need not call ``super().__init__()``.

    Args:
      fn: a single-lane function to wrap: ``fn(obs[, key])``, or with
        ``params`` ``fn(params, obs[, key])``, returning an action or a chunk.
      spec: input name -> ``jaxmesh.adapt`` declaration.
      native_chunk: the chunk length K, if the model emits chunks.
      params: the weights pytree corners read as ``self.params``.
      name: a display name (default: the class or function name).
      device: where params are placed: a ``jax.Device``, ``'cpu'``, ``'gpu'``,
        ``'gpu:1'``, or None.
    """

    native_chunk: int | None = None
    spec: Mapping[str, adapt.Input] | None = None
    params: Any = _Params()
    device: Any = None
    #: Extra JSON-ready fields merged into ``describe()``.
    metadata: Mapping[str, Any] | None = None

    # Class-level defaults, so that a subclass whose __init__ skips ours works.
    _fn: Callable | None = None
    _name: str | None = None
    _fn_takes_params: bool = False
    _class_params: Any = None  # a subclass's `params = ...` class attribute
    _config: Mapping[str, Any] = MappingProxyType({})
    _loaded: bool = False
    _loading: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "params" in vars(cls) and not isinstance(vars(cls)["params"], _Params):
            cls._class_params = vars(cls)["params"]
            cls.params = _Params()
        for name, value in vars(cls).items():
            if isinstance(value, Param) and name in _RESERVED:
                raise TypeError(
                    f"{cls.__name__}.{name} = Param(...): {name!r} is a jaxmesh.Model "
                    "attribute; give the param another name"
                )
        for name in (*CORNERS, "initial_state"):
            fn = vars(cls).get(name)
            if fn is vars(Model).get(name):
                continue  # the base placeholder: not an implemented corner
            if inspect.isfunction(fn) and not getattr(fn, "_jaxmesh_loads_first", 0):
                setattr(cls, name, _loads_first(fn))

    def __init__(
        self,
        fn: Callable | None = None,
        *,
        spec: Mapping[str, adapt.Input] | None = None,
        native_chunk: int | None = None,
        params: Any = None,
        name: str | None = None,
        device: Any = None,
    ):
        if fn is not None and not callable(fn):
            raise TypeError(f"Model(fn={fn!r}): fn must be callable")
        self._fn = fn
        self._name = name
        given = {"spec": adapt.check_spec(spec), "native_chunk": native_chunk}
        for key, value in dict(given, params=params, device=device).items():
            if value is not None:  # else the class's
                setattr(self, key, value)
        self._fn_takes_params = fn is not None and params is not None
        self._check()

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None = None, /, **kw: Any):
        """Builds a model with no constructor arguments from ``config`` and
        ``kw`` (overriding it), checked against the ``jaxmesh.Param``
        declarations; ``load`` receives the values.

        Raises:
          ParamError: an unknown name, a missing required param, or a value
            outside its param's domain.
        """
        if cls is Model:
            raise TypeError(
                "Model.from_config: call it on a Model subclass (MyModel.from_config)"
            )
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(
                f"{cls.__name__}.from_config(config={config!r}): expected a dict of "
                "param name to value"
            )
        values = validate_config(cls, {**(config or {}), **kw})
        obj = cls.__new__(cls)
        obj._config = MappingProxyType(values)
        try:
            inspect.signature(obj.__init__).bind()
        except TypeError as e:
            raise TypeError(
                f"{cls.__name__}.from_config builds the model with no constructor "
                f"arguments, but {cls.__name__}.__init__ needs some ({e}); give them "
                "defaults, or declare them as jaxmesh.Param"
            ) from None
        obj.__init__()
        return obj

    @classmethod
    def params_schema(cls) -> dict[str, Param]:
        """The params ``from_config`` accepts: name -> ``jaxmesh.Param``."""
        return params_schema(cls)

    @property
    def config(self) -> dict[str, Any]:
        """The configuration this instance was built with (``from_config``)."""
        return dict(self._config)

    def load(self, **config: Any) -> None:
        """Hook for heavy work (imports, weights; set ``self.params``), run once
        before any predict with the ``from_config`` values (none for
        ``MyModel()``)."""

    def _ensure_loaded(self) -> None:
        """Runs ``load`` once per instance."""
        if self._loaded or self._loading:
            return
        self._check()
        config = dict(self._config)
        try:
            inspect.signature(self.load).bind(**config)
        except TypeError as e:
            cls = type(self).__name__
            raise TypeError(
                f"{cls}.load cannot run with the configuration {config} ({e}): "
                f"build the model with {cls}.from_config(...) giving its params, or "
                "give load's parameters defaults"
            ) from None
        self._loading = True
        try:
            # Weights made in load must be concrete even when the first call
            # comes from inside a trace; only then, as this skips the op cache.
            traced = isinstance(jnp.zeros(()), jax.core.Tracer)
            with jax.ensure_compile_time_eval() if traced else contextlib.nullcontext():
                self.load(**config)
        finally:
            self._loading = False
        self._loaded = True
        self._check()

    def _check(self) -> None:
        """Validates the model's declared attributes."""
        who, k = self.name, self.native_chunk
        adapt.check_spec(self.spec)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(
                f"{who}: native_chunk={k!r} must be a positive int (the chunk length "
                "K the model emits) or None"
            )
        check_device(self.device, who)
        if self._fn is None and not self.corners():
            raise TypeError(
                f"{type(self).__name__} implements none of the corners {CORNERS}: "
                "define at least one (e.g. predict(self, obs)) or wrap a function "
                "with jaxmesh.Model(fn)"
            )

    def name_hint(self, name: str | None = None) -> str:
        if name:
            return name
        fn = self._fn
        if fn is not None:
            return getattr(fn, "__name__", type(fn).__name__)
        return type(self).__name__

    @property
    def name(self) -> str:
        return self.name_hint(self._name)

    def corners(self) -> tuple[str, ...]:
        """The corners this model implements itself."""
        if self._fn is not None:
            return ()
        return tuple(
            c for c in CORNERS if getattr(type(self), c) is not getattr(Model, c)
        )

    @property
    def recurrent(self) -> bool:
        return type(self).initial_state is not Model.initial_state

    def _engine_corner(self) -> tuple[str, bool]:
        """The corner the engine calls, and whether it is batched."""
        own = self.corners()
        chunk = "_chunk" if any("chunk" in c for c in own) else ""
        batch = f"predict{chunk}_batch"
        return (batch, True) if batch in own else (f"predict{chunk}", False)

    @property
    def stochastic(self) -> bool:
        """Whether the corner the engine calls takes a PRNG ``key``."""
        if self._fn is not None:
            base = 1 + int(self._fn_takes_params)
            arity = positional_arity(self._fn)
            return arity == base + 1 or (arity == base and takes_param(self._fn, "key"))
        corner, _ = self._engine_corner()
        return corner in self.corners() and takes_param(getattr(self, corner), "key")

    def initial_state(self) -> Any:
        """Single-lane recurrent state at an episode start (recurrent models)."""
        return None

    def on_episode_end(self, episode_id: int) -> None:
        """Host-side hook, once per ended episode, in episode order."""

    def close(self) -> None:
        """Releases resources; ``evaluate`` never calls it."""

    def placed_params(self) -> Any:
        """``self.params`` (loaded: reading them loads) on ``self.device``."""
        return self.place(self.params)

    def place(self, tree: Any) -> Any:
        """Puts every array leaf of ``tree`` on ``self.device`` (None: as is).

        Raises:
          ValueError: this machine has no such device.
        """
        return _put(tree, resolve_device(self.device, self.name))

    def as_policy(self, *, with_params: bool = False) -> Policy:
        """The engine's ``jaxmesh.types.Policy`` of this model (``PolicyLike``),
        after ``load``; ``with_params``: params come as a jit argument (a
        wrapped function takes them first).

        Raises:
          TypeError: a wrapped function of the wrong arity.
          ValueError: no such device here.
        """
        self._ensure_loaded()
        device = resolve_device(self.device, self.name)
        if self._fn is not None:
            apply, stochastic = _wrap_function(
                self._fn, self.name, with_params or self._fn_takes_params
            )
            corner, told = None, self._fn
        else:
            apply, stochastic = self._corner_apply()
            corner = self._engine_corner()[0]
            told = getattr(self, corner)
        own_hook = type(self).on_episode_end is not Model.on_episode_end
        place = functools.partial(_put, device=device)
        return Policy(
            name=self.name,
            apply=apply,
            stochastic=stochastic,
            initial_state=self.initial_state if self.recurrent else None,
            native_chunk=self.native_chunk,
            spec=adapt.check_spec(self.spec),
            default_params=lambda: place(self.params),
            place=place,
            device=device,
            on_episode_end=self.on_episode_end if own_hook else None,
            takes_execution_horizon=takes_param(told, EXECUTION_HORIZON),
            declares_chunk=corner in ("predict_chunk", "predict_chunk_batch"),
        )

    def _corner_apply(self) -> tuple[Callable, bool]:
        """The batched ``apply`` over this model's corner."""
        name, batched = self._engine_corner()
        corner = getattr(self, name)
        stochastic = takes_param(corner, "key")
        recurrent = self.recurrent

        def apply(params, obs, keys, rstate, execution_horizon=None):
            def lane(obs, key, state):
                kw = {"key": key} if stochastic else {}
                if execution_horizon is not None:
                    kw[EXECUTION_HORIZON] = execution_horizon
                if not recurrent:
                    return corner(obs, **kw), state
                out = corner(obs, **kw, state=state)
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise TypeError(
                        f"{self.name}.{name} is recurrent (the model defines "
                        "initial_state) and must return (output, new_state); it "
                        f"returned a {type(out).__name__}"
                    )
                return out

            with self._bound(params):
                if batched:
                    return lane(obs, keys, rstate)
                return jax.vmap(lane)(obs, keys, rstate)

        return apply, stochastic

    @contextlib.contextmanager
    def _bound(self, params: Any):
        """Makes ``self.params`` read ``params`` while a corner is traced."""
        missing = object()
        old = self.__dict__.get("params", missing)
        self.__dict__["params"] = params
        try:
            yield self
        finally:
            if old is missing:
                self.__dict__.pop("params", None)
            else:
                self.__dict__["params"] = old

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description of the model and its ``metadata`` (without
        ``load``; docs/models.md, "describe()").

        Raises:
          ValueError: a ``metadata`` field reuses one of the own fields.
        """
        cls = type(self)
        doc = inspect.getdoc(cls) if cls.__doc__ else None
        out: dict[str, Any] = {
            "schema_version": DESCRIBE_SCHEMA_VERSION,
            "name": self.name,
            "class": f"{cls.__module__}.{cls.__qualname__}",
            # The first paragraph: a summary may wrap onto several lines.
            "doc": " ".join(doc.split("\n\n")[0].split()) if doc else None,
            "wraps": None if self._fn is None else self.name_hint(),
            "corners": list(self.corners()),
            "native_chunk": self.native_chunk,
            "stochastic": self.stochastic,
            "recurrent": self.recurrent,
            "spec": self.spec and {k: _spec_to_dict(d) for k, d in self.spec.items()},
            "reads": adapt.read_keys(self.spec),
            "params": {k: p.to_dict() for k, p in params_schema(cls).items()},
            "config": {k: _jsonable(v) for k, v in self._config.items()},
            "device": None if self.device is None else str(self.device),
        }
        for key, value in dict(self.metadata or {}).items():
            if key in out:
                raise ValueError(
                    f"{cls.__name__}.metadata[{key!r}] would replace describe()'s "
                    f"own field {key!r}; rename it (reserved: {sorted(out)})"
                )
            out[key] = _jsonable(value)
        return out

    def explain(self, env: Any, num_envs: int = 1, instruction: Any = None):
        """``jaxmesh.explain`` of this model on ``env``."""
        return explain(self, env, num_envs=num_envs, instruction=instruction)

    def _placeholder(self, obs):  # pragma: no cover - never called
        raise NotImplementedError

    # The four corners. Authored subclasses override any of them.
    predict = predict_chunk = predict_batch = predict_chunk_batch = _placeholder

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


_RESERVED = frozenset(n for n in dir(Model) if not n.startswith("__"))


def resolve_class(target: str) -> Any:
    """Imports ``'package.module:Name'`` (or ``'package.module.Name'``)."""
    if not isinstance(target, str) or not target:
        raise TypeError(f"expected 'package.module:Class', got {target!r}")
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"{target!r}: expected 'package.module:Class' (e.g. "
            "'my_policies.act:ACTPolicy')"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"{target!r}: cannot import module {module_name!r}: {e}"
        ) from e
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise ValueError(
            f"{target!r}: module {module_name!r} has no attribute {attr!r}"
        ) from None


def build_model(
    target: str | type[Model] | Model | Callable,
    config: Mapping[str, Any] | None = None,
    *,
    device: Any = None,
) -> Model:
    """Builds a model as a YAML config describes one.

    Args:
      target: a ``Model`` subclass, ``'package.module:Class'``, a ``Model``
        (returned as it is), or a policy function (wrapped).
      config: the param values, for ``Class.from_config``.
      device: the model's device (see ``Model``).

    Raises:
      ParamError: a bad config.
    """
    obj = resolve_class(target) if isinstance(target, str) else target
    if isinstance(obj, type) and issubclass(obj, Model):
        model = obj.from_config(config or {})
    elif isinstance(obj, Model) or callable(obj):
        if config:
            raise ParamError(
                f"{target!r} is not a Model class, so it takes no config; got "
                f"{dict(config)!r}",
                param=next(iter(config)),
                value=dict(config),
                allowed="no params",
            )
        model = obj if isinstance(obj, Model) else Model(obj)
    else:
        raise TypeError(
            f"{target!r} is a {type(obj).__name__}; expected a jaxmesh.Model "
            "subclass or a policy function"
        )
    if device is not None:
        model.device = check_device(device, model.name)
    return model


__all__ = [
    "Model",
    "CORNERS",
    "DESCRIBE_SCHEMA_VERSION",
    "build_model",
    "resolve_class",
]
