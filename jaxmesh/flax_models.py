"""Models from flax modules: ``from_nnx`` (flax NNX) and ``from_linen``.

Both return a ``jaxmesh.Model`` whose ``params`` is a plain nested dict of
arrays (``jaxmesh.save_params`` / ``load_params``; new weights never
recompile); docs/models.md has examples. With ``stochastic=True`` every lane
samples with its own key: a batched module is called row by row (vmapped),
so its batched corners take one key per row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, Unpack

import jax
from flax import nnx

from jaxmesh import adapt
from jaxmesh.model import Model

Forward = Callable[[Any, Any, Any], Any]  # (params, obs, key) -> output


class FlaxModel(Model):
    """A ``jaxmesh.Model`` around a pure ``forward(params, obs, key)`` (key
    None when deterministic), its output through ``postprocess``; built by
    ``from_nnx`` and ``from_linen``, one subclass per corner."""

    _forward: Forward
    _postprocess: Callable[[Any], Any] | None = None

    def _run(self, obs: Any, key: Any, rows: bool = False) -> Any:
        """The forward and postprocess (``rows``: row i with ``key[i]``)."""
        params = self.params

        def row(o: Any, k: Any) -> Any:
            one = jax.tree.map(lambda x: x[None], o)
            return jax.tree.map(lambda x: x[0], self._forward(params, one, k))

        out = jax.vmap(row)(obs, key) if rows else self._forward(params, obs, key)
        return out if self._postprocess is None else self._postprocess(out)


@functools.cache
def _model_class(corner: str, stochastic: bool) -> type[FlaxModel]:
    """The ``FlaxModel`` subclass implementing exactly ``corner``."""
    if stochastic:
        rows = corner.endswith("_batch")

        def method(self, obs, key):
            return self._run(obs, key, rows)
    else:

        def method(self, obs):
            return self._run(obs, None)

    method.__name__ = method.__qualname__ = corner
    name = "Flax" + "".join(w.title() for w in corner.split("_"))
    return type(name, (FlaxModel,), {corner: method, "__module__": __name__})


class FlaxOptions(TypedDict, total=False):
    """The keywords ``from_nnx`` and ``from_linen`` share."""

    native_chunk: int | None
    spec: Mapping[str, adapt.Input] | None
    name: str | None
    device: Any
    batched: bool
    stochastic: bool
    postprocess: Callable[[Any], Any] | None


def _check_options(caller: str, options: FlaxOptions) -> None:
    """Refuses a keyword ``caller`` does not take, in Python's own words."""
    for key in options:
        if key not in FlaxOptions.__annotations__:
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}")


def _build(
    forward: Forward, params: Any, module: Any, options: FlaxOptions
) -> FlaxModel:
    """The model of ``forward`` and ``params`` with ``options``."""
    native_chunk = options.get("native_chunk")
    corner = "predict_chunk" if native_chunk is not None else "predict"
    if options.get("batched", True):
        corner += "_batch"
    model = _model_class(corner, options.get("stochastic", False))(
        native_chunk=native_chunk,
        params=params,
        spec=options.get("spec"),
        name=options.get("name") or type(module).__name__,
        device=options.get("device"),
    )
    model._forward, model._postprocess = forward, options.get("postprocess")
    return model


def _str_keys(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree


def from_nnx(
    module: Any,
    *,
    params: Any = None,
    trainable: Any = None,
    **options: Unpack[FlaxOptions],
) -> FlaxModel:
    """A model from a flax NNX module, its trainable state as ``params`` and
    the rest (RNG state, batch statistics) fixed; call ``module.eval()`` first
    if it has dropout or batch norm.

    Args:
      module: an ``nnx.Module``; ``module(obs[, key])`` returns the action,
        chunk, or what ``postprocess`` turns into one.
      params: weights instead of the module's own (a nested dict or an
        ``nnx.State``).
      native_chunk: K if the module emits chunks of K actions.
      spec: the input declarations (then ``obs`` is a dict of inputs).
      name: display name (default: the module's class name).
      device: where params are placed (see ``jaxmesh.Model``).
      batched: the module takes a batch of lanes (default) or one lane.
      stochastic: call ``module(obs, key)`` with a per-lane PRNG key.
      postprocess: ``output -> action or chunk``, e.g.
        ``lambda logits: jnp.argmax(logits, -1)``.
      trainable: the nnx filter selecting the params (default ``nnx.Param``).
    """
    _check_options("from_nnx", options)

    if not isinstance(module, nnx.Module):
        raise TypeError(
            f"from_nnx({module!r}): expected an nnx.Module instance (for a linen "
            "module, use from_linen(module, params))"
        )
    graphdef, state, rest = nnx.split(module, trainable or nnx.Param, ...)
    if params is None or isinstance(params, nnx.State):
        params = nnx.to_pure_dict(state if params is None else params)
    # String keys throughout (nnx.List indices are ints): the same tree as a
    # checkpoint restores, so swapping in loaded weights never recompiles.
    params = _str_keys(params)

    def forward(params, obs, key):
        net = nnx.merge(graphdef, params, rest)
        return net(obs) if key is None else net(obs, key)

    return _build(forward, params, module, options)


def from_linen(
    module: Any,
    params: Any,
    *,
    method: str | Callable | None = None,
    **options: Unpack[FlaxOptions],
) -> FlaxModel:
    """A model calling ``module.apply(params, obs[, key])`` of a flax linen
    module.

    Args:
      params: the variables from ``module.init`` or ``jaxmesh.load_params``.
      method: the module method to apply (default ``__call__``).
      options: as for ``from_nnx``.
    """
    _check_options("from_linen", options)
    if params is None:
        raise ValueError(
            f"from_linen({type(module).__name__}): params is None; pass the "
            "variables from module.init(key, obs) or jaxmesh.load_params(path)"
        )

    def forward(params, obs, key):
        args = (obs,) if key is None else (obs, key)
        return module.apply(params, *args, method=method)

    return _build(forward, params, module, options)


__all__ = ["from_nnx", "from_linen", "FlaxModel"]
