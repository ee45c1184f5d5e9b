"""Input declarations: what a policy reads from the environment (CONTRACT 13-15).

A spec is a dict from a model input name to one of the declarations below. Each
declaration turns one single-lane observation into one *frame*; ``stack=n`` keeps
a window of the last ``n`` frames (oldest first) on the device, advanced on every
executed env step. Example::

    spec = {"obs": jaxmesh.adapt.State(stack=4), "prev": jaxmesh.adapt.Previous()}

Every declaration says what its frame is made from, so that the engine needs no
list of declaration classes: ``reads_obs`` (its frame comes from the
observation, pushed after every env step) and ``reads_action`` (its frame comes
from the executed action, pushed when the action is chosen).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

#: Input name of the whole observation when a policy has no spec (the engine
#: keeps one ``State()`` window under this name).
WHOLE_OBS = "__obs__"


def _check_stack(kind: str, stack: Any) -> None:
    if isinstance(stack, bool) or not isinstance(stack, int) or stack < 1:
        raise ValueError(
            f"{kind}(stack={stack!r}): stack must be an int >= 1 "
            "(the number of frames in the window)"
        )


def _leaf(decl: State | Image, obs: Any) -> jax.Array:
    """The observation leaf a declaration reads (``obs[key]`` or the whole obs)."""
    if decl.key is None:
        return obs
    if not isinstance(obs, Mapping):
        raise ValueError(
            f"{type(decl).__name__}(key={decl.key!r}) reads a dict key, but the env "
            f"observation is a {type(obs).__name__}; use key=None for the whole "
            "observation"
        )
    if decl.key not in obs:
        raise ValueError(
            f"{type(decl).__name__}(key={decl.key!r}): the env observation has no "
            f"such key; its keys are {sorted(obs)}"
        )
    return obs[decl.key]


@dataclasses.dataclass(frozen=True)
class State:
    """A state leaf as it is: ``obs[key]``, or the whole observation for None."""

    key: str | None = None
    stack: int = 1

    reads_obs: ClassVar[bool] = True
    reads_action: ClassVar[bool] = False

    def __post_init__(self):
        _check_stack("State", self.stack)

    def frame(self, obs: Any, action: Any = None) -> Any:
        del action
        return _leaf(self, obs)


@dataclasses.dataclass(frozen=True)
class Image:
    """An image leaf (H, W) or (H, W, C), resized on the device and converted.

    A uint8 image (8-bit pixels) becomes ``dtype`` in [0, 1] (divided by 255);
    any other dtype is converted to ``dtype`` with its values kept (an int16
    depth map in millimetres stays in millimetres). ``size=(h, w)`` resizes
    with ``jax.image.resize`` (bilinear), keeping the channel axis.
    """

    key: str | None = None
    size: tuple[int, int] | None = None
    stack: int = 1
    dtype: Any = jnp.float32

    reads_obs: ClassVar[bool] = True
    reads_action: ClassVar[bool] = False

    def __post_init__(self):
        _check_stack("Image", self.stack)
        if self.size is not None:
            size = tuple(self.size)
            if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
                raise ValueError(
                    f"Image(size={self.size!r}): size must be (height, width) "
                    "of positive ints"
                )
            object.__setattr__(self, "size", size)

    def frame(self, obs: Any, action: Any = None) -> jax.Array:
        del action
        img = jnp.asarray(_leaf(self, obs))
        if img.ndim not in (2, 3):
            raise ValueError(
                f"Image(key={self.key!r}) expects an (H, W) or (H, W, C) leaf, "
                f"got shape {img.shape}; use State for non-image leaves"
            )
        if img.dtype == jnp.uint8:
            img = img.astype(jnp.float32) / 255.0
        img = img.astype(self.dtype)
        if self.size is not None and tuple(img.shape[:2]) != self.size:
            shape = self.size + tuple(img.shape[2:])
            img = jax.image.resize(img, shape, method="bilinear").astype(self.dtype)
        return img


@dataclasses.dataclass(frozen=True)
class Previous:
    """The action executed on the previous step (zeros at an episode's start)."""

    stack: int = 1

    reads_obs: ClassVar[bool] = False
    reads_action: ClassVar[bool] = True

    def __post_init__(self):
        _check_stack("Previous", self.stack)

    def frame(self, obs: Any, action: Any = None) -> Any:
        del obs
        return action


Input = State | Image | Previous


def check_spec(spec: Any) -> dict[str, Input] | None:
    """Validates a spec dict; returns it as a plain dict (or None)."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or not spec:
        raise TypeError(
            f"spec must be a non-empty dict of input name to State/Image/Previous, "
            f"got {spec!r}"
        )
    out = {}
    for name, decl in spec.items():
        if not isinstance(name, str):
            raise TypeError(f"spec keys must be strings, got {name!r}")
        if not isinstance(decl, State | Image | Previous):
            raise TypeError(
                f"spec[{name!r}] = {decl!r}: expected jaxmesh.adapt.State, Image "
                "or Previous"
            )
        out[name] = decl
    return out


def read_keys(spec: Mapping[str, Input] | None) -> list[str | None]:
    """The observation leaves a spec reads (None means the whole observation)."""
    if spec is None:
        return [None]
    keys: list[str | None] = []
    for decl in spec.values():
        if decl.reads_obs and decl.key not in keys:
            keys.append(decl.key)
    return keys


__all__ = ["State", "Image", "Previous", "WHOLE_OBS", "check_spec", "read_keys"]
