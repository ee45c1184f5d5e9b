"""Saving and loading policy params with orbax-checkpoint (its ``v1`` API).

Loading reads the saved tree's metadata first and restores into that abstract
tree, so the caller needs no template (docs/cli.md, "Checkpoints from Python").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxmesh.devices import resolve_device


def _abs_path(path: str | os.PathLike) -> Path:
    # orbax rejects relative paths.
    return Path(os.fspath(path)).expanduser().absolute()


def save_params(
    path: str | os.PathLike, params: Any, *, overwrite: bool = False
) -> Path:
    """Saves a params pytree (leaves: ``jax.Array``, ``np.ndarray``, Python
    numbers, strings) as an orbax checkpoint directory, atomically.

    Args:
      path: the checkpoint directory to create (with its parents).
      params: the pytree, e.g. the output of a flax ``Module.init``.
      overwrite: replace a checkpoint (or any directory) already at ``path``.

    Returns:
      The absolute path written.

    Raises:
      FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    target = _abs_path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"save_params: {str(target)!r} already exists; pass overwrite=True to "
            "replace it, or choose another path"
        )
    ocp.v1.save(target, params, overwrite=overwrite)
    return target


def _abstract_leaf(meta: Any, sharding: jax.sharding.Sharding, placed: bool) -> Any:
    # orbax's metadata classes are non-runtime Protocols, so tell them apart by
    # their fields: a saved jax.Array records its sharding, a numpy array not
    # (restored as numpy unless a device is asked for).
    array = hasattr(meta, "shape") and hasattr(meta, "dtype")
    if hasattr(meta, "sharding_metadata") or (placed and array):
        return jax.ShapeDtypeStruct(meta.shape, meta.dtype, sharding=sharding)
    if array:
        return np.empty(meta.shape, meta.dtype)
    return meta  # scalars and strings: orbax's metadata is the leaf itself


def load_params(
    path: str | os.PathLike, *, device: jax.Device | str | None = None
) -> Any:
    """Loads a params pytree saved by ``save_params``.

    Args:
      path: the checkpoint directory.
      device: where every array leaf goes, as a ``jax.Array`` (a
        ``jax.Device`` or a string such as ``'gpu:1'``). None: ``jax.Array``
        leaves to the default device, numpy leaves stay numpy.

    Returns:
      The pytree as saved: same structure, dtypes and shapes.

    Raises:
      FileNotFoundError: nothing exists at ``path``.
      ValueError: ``path`` is not an orbax checkpoint, or no such device.
      TypeError: ``device`` is not None, a ``jax.Device`` or a string.
    """
    device = resolve_device(device, "load_params")
    source = _abs_path(path)
    if not source.exists():
        raise FileNotFoundError(
            f"load_params: no checkpoint at {str(source)!r} (given {str(path)!r}); "
            "pass the directory written by jaxmesh.save_params(path, params), or "
            "create one there first"
        )
    not_checkpoint = (
        f"load_params: {str(source)!r} exists but is not an orbax checkpoint "
        "directory; pass the directory written by jaxmesh.save_params"
    )
    if not source.is_dir():
        raise ValueError(not_checkpoint)
    try:
        # is_orbax_checkpoint() accepts any directory (orbax 0.12.8); reading
        # the metadata is the real test.
        saved = ocp.v1.metadata(source).metadata
    except ValueError as e:
        raise ValueError(f"{not_checkpoint} (orbax: {e})") from e
    sharding = jax.sharding.SingleDeviceSharding(device or jax.devices()[0])
    placed = device is not None
    abstract = jax.tree.map(lambda m: _abstract_leaf(m, sharding, placed), saved)
    return ocp.v1.load(source, abstract)
