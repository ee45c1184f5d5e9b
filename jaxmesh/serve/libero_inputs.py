"""openpi's LIBERO request (its examples/libero/main.py), built in numpy from one
lane of a jaxmesh LIBERO env; the resize follows Pillow's fixed-point
resampling step by step, so its pixels equal openpi's (docs/serving.md).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

#: The side of the images openpi's LIBERO models take.
SIZE = 224
#: Pillow's fixed-point weights: 32 - 8 - 2 fraction bits.
_BITS = 22


def quat_to_axis_angle(quat: Any) -> np.ndarray:
    """A quaternion ``(x, y, z, w)`` (robosuite's order) as an axis-angle vector
    (the axis times the angle, radians); ``w`` is clipped to [-1, 1]."""
    q = np.asarray(quat, np.float64)
    w = min(max(float(q[3]), -1.0), 1.0)
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):  # (close to) no rotation
        return np.zeros(3)
    return q[:3] * 2.0 * math.acos(w) / den


@functools.lru_cache(maxsize=16)
def _taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's bilinear resampling of one axis: output ``i`` is the sum over
    taps ``t`` of ``weights[t, i] * input[index[t, i]]`` (``_BITS`` fraction
    bits; ``[taps, size_out]`` each; unused taps weigh 0)."""
    scale = size_in / size_out
    filterscale = max(scale, 1.0)
    support = filterscale  # the triangle filter's support is 1
    rows = []
    for i in range(size_out):
        center = (i + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), size_in)
        x = (np.arange(lo, hi) - center + 0.5) * (1.0 / filterscale)
        w = np.maximum(1.0 - np.abs(x), 0.0)
        total = w.sum()
        if total != 0.0:
            w = w / total
        rows.append((lo, (0.5 + w * (1 << _BITS)).astype(np.int32)))
    taps = max(len(w) for _, w in rows)
    index = np.zeros((taps, size_out), np.intp)
    weights = np.zeros((taps, size_out), np.int32)
    for i, (lo, w) in enumerate(rows):
        index[:, i] = np.minimum(lo + np.arange(taps), size_in - 1)
        weights[: len(w), i] = w
    index.flags.writeable = weights.flags.writeable = False  # cached, shared
    return index, weights


def _resample(image: np.ndarray, size_out: int, axis: int) -> np.ndarray:
    """One pass of Pillow's 8-bit resampling along ``axis`` to ``size_out``."""
    index, weights = _taps(image.shape[axis], size_out)
    shape = [1] * image.ndim
    shape[axis] = size_out
    acc = np.full(1, 1 << (_BITS - 1), np.int32)  # sums stay below 2**31
    for idx, w in zip(index, weights, strict=True):
        acc = acc + np.take(image, idx, axis=axis) * w.reshape(shape)
    return np.clip(acc >> _BITS, 0, 255).astype(np.uint8)


def resize_with_pad(image: np.ndarray, size: int = SIZE) -> np.ndarray:
    """``image`` ([H, W, C] uint8) scaled to fit ``size x size`` (bilinear, as
    PIL resizes) and centred on zeros: ``[size, size, C]``."""
    h, w = image.shape[:2]
    if (h, w) == (size, size):
        return image
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    resized = image
    if rw != w:
        resized = _resample(resized, rw, axis=1)
    if rh != h:
        resized = _resample(resized, rh, axis=0)
    out = np.zeros((size, size, *image.shape[2:]), np.uint8)
    top, left = max(0, int((size - rh) / 2)), max(0, int((size - rw) / 2))
    out[top : top + rh, left : left + rw] = resized
    return out


def _camera(image: Any, size: int) -> np.ndarray:
    upright = np.ascontiguousarray(np.asarray(image)[::-1, ::-1])
    if np.issubdtype(upright.dtype, np.floating):
        upright = (255 * upright).astype(np.uint8)
    return resize_with_pad(upright, size)


def libero_inputs(obs: dict, instruction: str | None, *, size: int = SIZE) -> dict:
    """openpi's LIBERO request for one lane's observation and instruction:
    both cameras (uint8 ``[size, size, 3]``) rotated 180 degrees and resized
    with padding, ``"observation/state"`` (end-effector position, axis-angle,
    gripper joints) and ``"prompt"`` (when there is an instruction)."""
    request = {
        "observation/image": _camera(obs["agentview_image"], size),
        "observation/wrist_image": _camera(obs["robot0_eye_in_hand_image"], size),
        "observation/state": np.concatenate(
            [
                np.asarray(obs["robot0_eef_pos"]),
                quat_to_axis_angle(obs["robot0_eef_quat"]),
                np.asarray(obs["robot0_gripper_qpos"]),
            ]
        ),
    }
    if instruction is not None:
        request["prompt"] = instruction
    return request


__all__ = ["SIZE", "libero_inputs", "quat_to_axis_angle", "resize_with_pad"]
