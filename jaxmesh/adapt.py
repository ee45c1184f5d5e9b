"""Input declarations: what a policy reads from the environment (CONTRACT 13-15).

A spec maps a model input name to a declaration, which turns one lane's
observation into a *frame*; ``stack=n`` keeps the last ``n`` frames, oldest
first. ``reads_obs`` / ``reads_action`` say what a frame is made from (``Text``
and ``PendingChunk`` read neither). Example::

    spec = {"obs": jaxmesh.adapt.State(stack=4), "prev": jaxmesh.adapt.Previous()}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

#: Input name of the whole observation when a policy has no spec (the engine
#: keeps one ``State()`` window under this name).
WHOLE_OBS = "__obs__"


def host_array(x: Any) -> np.ndarray:
    """``x`` as numpy in the dtype JAX computes in (int64 is int32 without x64),
    so that what the host feeds matches the program."""
    x = np.asarray(x)
    return x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)


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


class _Input:
    """What a declaration reads by default: neither the observation nor the
    action; one frame (a declaration with a ``stack`` field checks it)."""

    reads_obs: ClassVar[bool] = False
    reads_action: ClassVar[bool] = False
    stack: ClassVar[int] = 1

    def __post_init__(self):
        n = self.stack
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(
                f"{type(self).__name__}(stack={n!r}): stack must be an int >= 1 "
                "(the number of frames in the window)"
            )


@dataclasses.dataclass(frozen=True)
class State(_Input):
    """A state leaf as it is: ``obs[key]``, or the whole observation for None."""

    key: str | None = None
    stack: int = 1

    reads_obs: ClassVar[bool] = True

    def frame(self, obs: Any, action: Any = None) -> Any:
        return _leaf(self, obs)


RESIZE_MODES = ("stretch", "pad", "crop")
ROTATIONS = (0, 90, 180, 270)


def _check_crop(crop: Any) -> float | tuple[int, int, int, int] | None:
    """``crop`` as stored: None, a fraction in (0, 1], or (top, left, h, w)."""
    if crop is None:
        return None
    if isinstance(crop, int | float) and not isinstance(crop, bool):
        if 0 < crop <= 1:
            return float(crop)
    elif isinstance(crop, tuple | list) and len(crop) == 4:
        px = tuple(crop)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in px):
            top, left, height, width = px
            if top >= 0 and left >= 0 and height > 0 and width > 0:
                return px
    raise ValueError(
        f"Image(crop={crop!r}): crop must be a centre-crop fraction f with "
        "0 < f <= 1 (f of the height and f of the width are kept), or "
        "(top, left, height, width) in pixels: ints, top and left >= 0, height "
        "and width > 0"
    )


def _crop_box(crop: Any, hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of ``crop`` on an image of (H, W) ``hw``."""
    H, W = hw
    if isinstance(crop, float):
        h = max(1, math.floor(H * crop + 0.5))
        w = max(1, math.floor(W * crop + 0.5))
        return (H - h) // 2, (W - w) // 2, h, w
    top, left, h, w = crop
    if top + h > H or left + w > W:
        raise ValueError(
            f"Image(crop={crop!r}): the box (top, left, height, width) reaches "
            f"row {top + h} and column {left + w}, outside the {H}x{W} image"
        )
    return crop


def _fit(hw: tuple[int, int], size: tuple[int, int], cover: bool) -> tuple[int, int]:
    """The aspect-kept size that fits inside (or covers) ``size``, computed as
    openpi's ``resize_with_pad`` does, so that sizes match."""
    (H, W), (h, w) = hw, size
    if cover:
        ratio = min(W / w, H / h)
        return max(h, int(H / ratio)), max(w, int(W / ratio))
    ratio = max(W / w, H / h)
    return min(h, max(1, int(H / ratio))), min(w, max(1, int(W / ratio)))


@dataclasses.dataclass(frozen=True)
class Image(_Input):
    """An image leaf (H, W) or (H, W, C), preprocessed on the device, in order:
    ``crop`` (a centre fraction in (0, 1], or ``(top, left, height, width)``
    pixels), ``rotate`` (degrees counter-clockwise), the dtype (uint8 / 255),
    then ``size=(h, w)`` by ``resize`` (``"stretch"``, ``"pad"`` as openpi or
    ``"crop"``). The rules: docs/models.md, "Image preprocessing".
    """

    key: str | None = None
    size: tuple[int, int] | None = None
    stack: int = 1
    dtype: Any = jnp.float32
    resize: str = "stretch"
    rotate: int = 0
    crop: float | tuple[int, int, int, int] | None = None

    reads_obs: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if self.size is not None:
            size = tuple(self.size)
            if len(size) != 2 or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size
            ):
                raise ValueError(
                    f"Image(size={self.size!r}): size must be (height, width) "
                    "of positive ints"
                )
            object.__setattr__(self, "size", size)
        if self.resize not in RESIZE_MODES:
            raise ValueError(
                f"Image(resize={self.resize!r}): resize must be one of "
                f"{', '.join(map(repr, RESIZE_MODES))}"
            )
        if self.resize != "stretch" and self.size is None:
            raise ValueError(
                f"Image(resize={self.resize!r}) needs size=(height, width) to resize to"
            )
        if isinstance(self.rotate, bool) or self.rotate not in ROTATIONS:
            raise ValueError(
                f"Image(rotate={self.rotate!r}): rotate must be 0, 90, 180 or 270 "
                "(degrees counter-clockwise)"
            )
        object.__setattr__(self, "crop", _check_crop(self.crop))

    def _plan(self, shape: tuple[int, ...], dtype: Any) -> list[tuple[str, Any]]:
        """(description, function) of each step for a leaf of shape and dtype
        (numbers bound as default arguments: later steps reuse the names)."""
        if len(shape) not in (2, 3):
            raise ValueError(
                f"Image(key={self.key!r}) expects an (H, W) or (H, W, C) leaf, "
                f"got shape {tuple(shape)}; use State for non-image leaves"
            )
        hw = tuple(shape[:2])
        out = self.dtype
        steps: list[tuple[str, Any]] = []
        if self.crop is not None:
            t, left, h, w = _crop_box(self.crop, hw)
            what = f"{self.crop:g}" if isinstance(self.crop, float) else str(self.crop)
            what += f" (rows {t}:{t + h}, cols {left}:{left + w} of {hw[0]}x{hw[1]})"
            box = (slice(t, t + h), slice(left, left + w))
            steps.append((f"crop {what}", lambda x, box=box: x[box]))
            hw = (h, w)
        if self.rotate:
            k = self.rotate // 90
            rotate = f"rotate {self.rotate} ccw"
            steps.append((rotate, lambda x, k=k: jnp.rot90(x, k, axes=(0, 1))))
            if k % 2:
                hw = (hw[1], hw[0])
        name = jnp.dtype(out).name
        if jnp.dtype(dtype) == jnp.uint8:
            steps.append(
                (f"{name} /255", lambda x: (x.astype(jnp.float32) / 255.0).astype(out))
            )
        elif jnp.dtype(dtype) != jnp.dtype(out):
            steps.append((f"{name} (values kept)", lambda x: x.astype(out)))
        if self.size is None or hw == self.size:
            return steps
        (h, w), rest = self.size, tuple(shape[2:])

        def bilinear(x, to):
            if tuple(x.shape[:2]) == to:
                return x
            return jax.image.resize(x, to + rest, method="bilinear").astype(out)

        if self.resize == "stretch":
            steps.append(
                (f"resize stretch {self.size}", lambda x, to=(h, w): bilinear(x, to))
            )
        elif self.resize == "pad":
            rh, rw = _fit(hw, self.size, cover=False)
            top, left = int((h - rh) / 2), int((w - rw) / 2)
            pad = ((top, h - rh - top), (left, w - rw - left)) + ((0, 0),) * len(rest)
            what = (
                f"resize pad {self.size} (fit {rh}x{rw}, zero rows "
                f"{pad[0][0]}+{pad[0][1]}, cols {pad[1][0]}+{pad[1][1]})"
            )
            steps.append(
                (what, lambda x, to=(rh, rw), pad=pad: jnp.pad(bilinear(x, to), pad))
            )
        else:
            rh, rw = _fit(hw, self.size, cover=True)
            top, left = (rh - h) // 2, (rw - w) // 2
            box = (slice(top, top + h), slice(left, left + w))
            what = (
                f"resize crop {self.size} (cover {rh}x{rw}, keep rows "
                f"{top}:{top + h}, cols {left}:{left + w})"
            )
            steps.append((what, lambda x, to=(rh, rw), box=box: bilinear(x, to)[box]))
        return steps

    def steps(self, shape: tuple[int, ...], dtype: Any) -> list[str]:
        """What ``frame`` does to a leaf of this shape and dtype, in order
        (steps that change nothing left out)."""
        return [what for what, _ in self._plan(tuple(shape), dtype)]

    def frame(self, obs: Any, action: Any = None) -> jax.Array:
        img = jnp.asarray(_leaf(self, obs))
        for _, step in self._plan(tuple(img.shape), img.dtype):
            img = step(img)
        return img


@dataclasses.dataclass(frozen=True)
class Previous(_Input):
    """The action executed on the previous step (zeros at an episode's start)."""

    stack: int = 1

    reads_action: ClassVar[bool] = True

    def frame(self, obs: Any, action: Any = None) -> Any:
        return action


@dataclasses.dataclass(frozen=True, eq=False)
class Text(_Input):
    """A language instruction, encoded on the host into fixed-shape arrays
    (docs/models.md, "Language instructions").

    Args:
      encode: ``str -> array or pytree of arrays`` (numbers or bools, the same
        shapes for every string), run once per distinct string.
      info_key: the reset-info key holding each episode's instruction (host
        envs), or None: ``Starts(instruction=...)``'s.
    """

    encode: Callable[[str], Any]
    info_key: str | None = None
    #: Encodings kept by string (and the first one, whose shapes all share).
    _cache: dict = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self):
        if not callable(self.encode):
            raise TypeError(
                f"Text(encode={self.encode!r}): encode must be a function "
                "str -> array (or pytree of arrays), e.g. a tokenizer"
            )
        if self.info_key is not None and not (
            isinstance(self.info_key, str) and self.info_key
        ):
            raise TypeError(
                f"Text(info_key={self.info_key!r}): expected the reset-info key "
                "(a non-empty string) that holds each episode's instruction, or None"
            )

    def encoded(self, instruction: str) -> Any:
        """``encode(instruction)`` as numpy arrays, computed once per string.

        Raises:
          TypeError: not a string, or ``encode`` returned no arrays of numbers.
          ValueError: its shapes or dtypes differ from the first string's.
        """
        cache = self._cache
        if instruction in cache:
            return cache[instruction]
        if not isinstance(instruction, str):
            raise TypeError(
                f"Text: the instruction {instruction!r} is a "
                f"{type(instruction).__name__}; expected a string"
            )
        out = jax.tree.map(host_array, self.encode(instruction))
        leaves = jax.tree.leaves(out)
        if not leaves or any(x.dtype.kind not in "biuf" for x in leaves):
            raise TypeError(
                f"Text: encode({instruction!r}) returned {_described(out)}; expected "
                "an array (or a pytree of arrays) of numbers or bools"
            )
        first = cache.get(_FIRST)
        if first is None:
            cache[_FIRST] = (instruction, out)
        elif signature(first[1]) != signature(out):
            raise ValueError(
                f"Text: encode({instruction!r}) gave {_described(out)}, but "
                f"encode({first[0]!r}) gave {_described(first[1])}; every "
                "instruction must encode to the same shapes and dtypes (pad or "
                "truncate to a fixed length)"
            )
        cache[instruction] = out
        return out

    def signature(self) -> Any:
        """The encodings' ``jax.ShapeDtypeStruct`` leaves (None: none yet)."""
        first = self._cache.get(_FIRST)
        return None if first is None else jax.tree.map(leaf_spec, first[1])


@dataclasses.dataclass(frozen=True)
class PendingChunk(_Input):
    """The unexecuted tail of the policy's previous chunk, and the delay, for
    real-time chunking: ``{"actions": (K,) + action shape, "mask": (K,) bool,
    "delay": int32}`` aligned with the chunk being planned (docs/evaluation.md,
    "Real-time chunking: the pending chunk"). Not with ``jaxmesh.Ensemble``
    nor single actions.

    Args:
      length: the chunk length K, when needed before the policy is first
        called; None: found by calling the policy, by shape only.
    """

    length: int | None = None

    def __post_init__(self):
        n = self.length
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(
                f"PendingChunk(length={n!r}): length must be the policy's chunk "
                "length K (an int >= 1), or None to find it by calling the policy"
            )


#: The cache key of a Text's first encoding (never a string).
_FIRST = object()


def leaf_spec(x: Any) -> jax.ShapeDtypeStruct:
    """Shape and dtype of an array, tracer, abstract value or Python scalar."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), jnp.dtype(x.dtype))
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


def signature(tree: Any) -> tuple:
    """A hashable signature of a pytree: structure, shapes and dtypes."""
    leaves = tuple((s.shape, s.dtype) for s in map(leaf_spec, jax.tree.leaves(tree)))
    return jax.tree.structure(tree), leaves


def _described(tree: Any) -> str:
    """Shapes and dtypes of a pytree of arrays, for messages."""

    def one(x: Any) -> str:
        if isinstance(x, np.ndarray):
            return f"{x.dtype.name}{list(x.shape)}"
        return type(x).__name__

    return str(jax.tree.map(one, tree))


Input = State | Image | Previous | Text | PendingChunk


def pending_inputs(spec: Mapping[str, Any] | None) -> dict[str, PendingChunk]:
    """The spec's PendingChunk inputs, name -> declaration, in spec order."""
    return {n: d for n, d in (spec or {}).items() if isinstance(d, PendingChunk)}


def text_inputs(spec: Mapping[str, Any] | None) -> dict[str, Text]:
    """The spec's Text inputs, name -> declaration, in spec order."""
    return {n: d for n, d in (spec or {}).items() if isinstance(d, Text)}


def check_spec(spec: Any) -> dict[str, Input] | None:
    """Validates a spec dict; returns it as a plain dict (or None)."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or not spec:
        raise TypeError(
            "spec must be a non-empty dict of input name to State/Image/Previous/"
            f"Text/PendingChunk, got {spec!r}"
        )
    for name, decl in spec.items():
        if not isinstance(name, str):
            raise TypeError(f"spec keys must be strings, got {name!r}")
        if not isinstance(decl, Input):
            raise TypeError(
                f"spec[{name!r}] = {decl!r}: expected jaxmesh.adapt.State, Image, "
                "Previous, Text or PendingChunk"
            )
    return dict(spec)


def read_keys(spec: Mapping[str, Input] | None) -> list[str | None]:
    """The observation leaves a spec reads (None means the whole observation)."""
    if spec is None:
        return [None]
    return list(dict.fromkeys(d.key for d in spec.values() if d.reads_obs))


__all__ = [
    "State",
    "Image",
    "Previous",
    "Text",
    "PendingChunk",
    "WHOLE_OBS",
    "check_spec",
    "read_keys",
    "text_inputs",
    "pending_inputs",
]
