"""Declared model configuration: ``jaxmesh.Param`` and ``jaxmesh.ParamError``
(``Model.from_config`` checks a config against them; docs/models.md)."""

from __future__ import annotations

import difflib
import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Param", "ParamError", "REQUIRED", "params_schema", "validate_config"]


class _Required:
    """The default of a param that has none: it must be given."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: Marks a ``Param`` without a default (``Param()`` is the same thing).
REQUIRED: Any = _Required()


class ParamError(ValueError):
    """A model configuration value is unknown, missing or out of its domain.

    Attributes:
      param: the param's name.
      value: the value given (``REQUIRED`` when it was missing).
      allowed: what the param accepts, in words.
    """

    def __init__(self, message: str, *, param: str, value: Any, allowed: str):
        super().__init__(message)
        self.param, self.value, self.allowed = param, value, allowed


def _type_name(t: type | tuple[type, ...]) -> str:
    return " or ".join(x.__name__ for x in (t if isinstance(t, tuple) else (t,)))


class Param:
    """One declared configuration value of a ``jaxmesh.Model``.

    Declare it as a class attribute; ``self.<name>`` reads the configured
    value (``MyModel.<name>`` stays the declaration).

    Args:
      default: the value used when none is given; omit it for a required param.
      doc: one line saying what the param does (shown by ``describe()``).
      choices: the only values allowed (a sequence).
      low, high: the smallest and largest allowed numbers (inclusive).
      type: the allowed type(s); default: the default's (an ``int`` passes as
        a ``float``, a ``bool`` never as a number; a default of None: any).

    Raises:
      ValueError: ``choices`` together with ``low``/``high``, ``low > high``, or
        a default outside the declared domain.
    """

    def __init__(
        self,
        default: Any = REQUIRED,
        *,
        doc: str = "",
        choices: Sequence[Any] | None = None,
        low: float | None = None,
        high: float | None = None,
        type: type | tuple[type, ...] | None = None,  # noqa: A002 - reads best
    ):
        if choices is not None and (low is not None or high is not None):
            raise ValueError(
                f"Param(choices={choices!r}, low={low!r}, high={high!r}): give "
                "either choices or a low/high range, not both"
            )
        if choices is not None:
            if isinstance(choices, str | bytes) or not isinstance(choices, Sequence):
                raise ValueError(
                    f"Param(choices={choices!r}): choices must be a list or tuple "
                    "of the allowed values"
                )
            choices = tuple(choices)
            if not choices:
                raise ValueError("Param(choices=()): give at least one allowed value")
        for bound, v in (("low", low), ("high", high)):
            if v is not None and not _is_number(v):
                raise ValueError(f"Param({bound}={v!r}): bounds must be numbers")
        if low is not None and high is not None and low > high:
            raise ValueError(f"Param(low={low!r}, high={high!r}): low exceeds high")
        if type is None and choices is None:
            type = _infer_type(default)
        self.default, self.doc, self.choices = default, doc, choices
        self.low, self.high, self.type = low, high, type
        self.name: str | None = None
        self.owner: str | None = None
        if default is not REQUIRED:
            self.check(default, who="default")

    # Descriptor protocol: MyModel.x is the declaration, instance.x the value.
    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner.__name__

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        config = obj.__dict__.get("_config") or {}
        if self.name in config:
            return config[self.name]
        if self.default is REQUIRED:
            raise self._error(
                f"{self.owner or 'Param'}: param {self.name!r} is required and this "
                f"instance was not configured with it; build the model with "
                f"{self.owner}.from_config({self.name}=...)"
            )
        return self.default

    def _error(self, message: str, value: Any = REQUIRED) -> ParamError:
        return ParamError(
            message, param=self.name or "?", value=value, allowed=self.allowed()
        )

    @property
    def required(self) -> bool:
        """Whether the param has no default and must be given."""
        return self.default is REQUIRED

    def allowed(self) -> str:
        """What the param accepts, in words."""
        if self.choices is not None:
            return f"one of {list(self.choices)!r}"
        parts = []
        if self.type is not None:
            parts.append(f"a {_type_name(self.type)}")
        if self.low is not None and self.high is not None:
            parts.append(f"in [{self.low!r}, {self.high!r}]")
        elif self.low is not None:
            parts.append(f">= {self.low!r}")
        elif self.high is not None:
            parts.append(f"<= {self.high!r}")
        return " ".join(parts) if parts else "any value"

    def check(self, value: Any, who: str = "value") -> Any:
        """Returns ``value`` if the param allows it, else raises ParamError."""

        def fail(why: str) -> ParamError:
            return self._error(
                f"{self.owner or 'Param'}: param {self.name or '?'!r} {who} "
                f"{value!r} {why}; allowed: {self.allowed()}",
                value,
            )

        if self.choices is not None:
            if not any(_same(value, c) for c in self.choices):
                raise fail("is not one of the choices")
            return value
        if self.type is not None and not _is_instance(value, self.type):
            raise fail(f"has type {type(value).__name__}")
        if self.low is not None or self.high is not None:
            if not _is_number(value):
                raise fail("is not a number")
            if self.low is not None and value < self.low:
                raise fail("is below the lowest allowed value")
            if self.high is not None and value > self.high:
                raise fail("is above the highest allowed value")
        return value

    def to_dict(self) -> dict:
        """The declaration as JSON-ready data (for ``describe()``)."""
        d: dict[str, Any] = {"required": self.required, "doc": self.doc}
        if not self.required:
            d["default"] = _jsonable(self.default)
        if self.type is not None:
            d["type"] = _type_name(self.type)
        if self.choices is not None:
            d["choices"] = [_jsonable(c) for c in self.choices]
        bounds = (("low", self.low), ("high", self.high))
        return d | {k: v for k, v in bounds if v is not None}

    def __repr__(self) -> str:
        fields = [] if self.required else [repr(self.default)]
        for f in ("doc", "choices", "low", "high"):
            v = getattr(self, f)
            if v not in (None, ""):
                fields.append(f"{f}={v!r}")
        return f"Param({', '.join(fields)})"


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _infer_type(default: Any) -> type | tuple[type, ...] | None:
    if isinstance(default, list | tuple):
        return (list, tuple)  # YAML gives lists where Python code wrote tuples
    kinds = ((bool, bool), (numbers.Integral, int), (numbers.Real, float), (str, str))
    return next((t for kind, t in kinds if isinstance(default, kind)), None)


def _is_instance(value: Any, t: type | tuple[type, ...]) -> bool:
    types = t if isinstance(t, tuple) else (t,)
    if isinstance(value, bool) and bool not in types:
        return False
    if float in types and isinstance(value, numbers.Real):
        return True
    if int in types and isinstance(value, numbers.Integral):
        return True
    return isinstance(value, types)


def _same(a: Any, b: Any) -> bool:
    # 1 == True in Python; a choice of True must not accept 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def _load_signature(load: Callable) -> tuple[dict[str, Param], bool]:
    """Keyword params of a ``load`` hook (implicit declarations), and **kwargs."""
    try:
        sig = inspect.signature(load)
    except (TypeError, ValueError):
        return {}, True
    implicit: dict[str, Param] = {}
    var_kw = False
    # Read from the class, load is a plain function: skip `self`.
    skip = 1 if inspect.isfunction(load) else 0
    for p in list(sig.parameters.values())[skip:]:
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            default = REQUIRED if p.default is p.empty else p.default
            # Undeclared: load's own default, no domain to check.
            decl = Param(type=object)
            decl.default, decl.type, decl.name = default, None, p.name
            implicit[p.name] = decl
    return implicit, var_kw


def params_schema(cls: type) -> dict[str, Param]:
    """The params a model class accepts, by name, in declaration order: the
    declared ``Param`` attributes, then ``load``'s other keyword parameters."""
    declared: dict[str, Param] = {}
    for klass in reversed(cls.__mro__):
        for name, v in vars(klass).items():
            if isinstance(v, Param):
                declared.pop(name, None)
                declared[name] = v
            elif name in declared:
                del declared[name]  # a subclass replaced the declaration
    load = getattr(cls, "load", None)
    implicit, _ = _load_signature(load) if load is not None else ({}, True)
    for name, decl in implicit.items():
        if name not in declared:
            decl.owner = cls.__name__
            declared[name] = decl
    return declared


def validate_config(cls: type, config: Mapping[str, Any]) -> dict[str, Any]:
    """The values for ``cls.load``: ``config`` checked against its params, and
    the defaults of the declared ones not given.

    Raises:
      ParamError: an unknown name, a missing required param, or a value outside
        its param's domain.
      TypeError: ``load`` does not accept a declared param.
    """
    schema = params_schema(cls)
    who = cls.__name__
    for name, value in config.items():
        if name not in schema:
            close = difflib.get_close_matches(str(name), list(schema), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = list(schema) or "none (declare them with jaxmesh.Param)"
            raise ParamError(
                f"{who}: unknown param {name!r} (value {value!r}); {who}'s params "
                f"are {known}{hint}",
                param=str(name),
                value=value,
                allowed=f"one of the names {list(schema)!r}",
            )
    out: dict[str, Any] = {}
    declared = {n for n in schema if isinstance(getattr(cls, n, None), Param)}
    for name, decl in schema.items():
        if name in config:
            out[name] = decl.check(config[name])
        elif decl.required:
            raise decl._error(
                f"{who}: param {name!r} is required and was not given; allowed: "
                f"{decl.allowed()}" + (f" ({decl.doc})" if decl.doc else "")
            )
        elif name in declared:
            out[name] = decl.default
    implicit, var_kw = _load_signature(cls.load)
    if not var_kw:
        missing = [n for n in out if n not in implicit]
        if missing:
            raise TypeError(
                f"{who}.load does not accept the declared param(s) {missing}: add "
                "them to load's signature, or give load a **config parameter"
            )
    return out
