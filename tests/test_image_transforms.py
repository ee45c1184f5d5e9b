"""``Image``'s crop, rotate and resize modes against references that share no
code with jaxmesh: PIL (``Image.resize`` with BILINEAR, ``Image.transpose``),
numpy (``np.rot90``, slicing, ``np.pad``) and geometry worked out by hand.

Resizes are compared on float32 images through PIL's 32-bit float mode ("F",
one channel at a time), so that no 8-bit rounding hides or adds a difference.
PIL's bilinear filter widens its support by the scale when shrinking
(antialiasing), and so does ``jax.image.resize`` (antialias=True, its default):
the two compute the same weights, and differ only by float32 rounding of sums of
a few dozen terms. The largest difference seen on these images is 1.7e-5 (a
256 -> 224 shrink); ``RESIZE_TOL = 1e-4`` leaves room for other float orders
and is 40 times smaller than one 8-bit level (1/255 = 3.9e-3). An
un-antialiased bilinear shrink (the usual mistake) is off by 0.2 or more here.
Crops, rotations and padding move pixels without arithmetic and are compared
exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image as PIL

import jaxmesh
from jaxmesh.adapt import Image

RESIZE_TOL = 1e-4
RNG = np.random.default_rng(7)


def rand(shape):
    return RNG.random(shape, dtype=np.float32)


def pil_resize(x, hw):
    """PIL bilinear resize of a float (H, W) or (H, W, C) array to (h, w)."""
    h, w = hw
    if x.ndim == 3:
        return np.stack([pil_resize(x[..., c], hw) for c in range(x.shape[2])], -1)
    out = PIL.fromarray(np.asarray(x, np.float32), mode="F").resize(
        (w, h), PIL.Resampling.BILINEAR
    )
    return np.asarray(out)


def pil_resize_with_pad(x, hw):
    """openpi's resize_with_pad (openpi_client.image_tools), written out on
    PIL: shrink or grow by the larger side ratio (sizes truncated with int()),
    paste on a zero image at (int((w - rw) / 2), int((h - rh) / 2))."""
    H, W = x.shape[:2]
    h, w = hw
    if (H, W) == (h, w):
        return x
    ratio = max(W / w, H / h)
    rh, rw = int(H / ratio), int(W / ratio)
    small = pil_resize(x, (rh, rw))
    out = np.zeros((h, w) + x.shape[2:], np.float32)
    top, left = max(0, int((h - rh) / 2)), max(0, int((w - rw) / 2))
    out[top : top + rh, left : left + rw] = small
    return out


def frame(decl, x):
    """The frame as the engine makes it: inside jit."""
    return np.asarray(jax.jit(decl.frame)(jnp.asarray(x)))


# Rotation -----------------------------------------------------------------------
TRANSPOSE = {
    90: PIL.Transpose.ROTATE_90,
    180: PIL.Transpose.ROTATE_180,
    270: PIL.Transpose.ROTATE_270,
}


@pytest.mark.parametrize("degrees", [0, 90, 180, 270])
def test_rotate_is_counter_clockwise_as_numpy_and_pil(degrees):
    x = np.arange(3 * 5 * 2, dtype=np.float32).reshape(3, 5, 2)
    got = frame(Image(rotate=degrees), x)
    np.testing.assert_array_equal(got, np.rot90(x, degrees // 90, axes=(0, 1)))
    # PIL's ROTATE_* turn counter-clockwise as shown on screen (row 0 on top).
    for c in range(2):
        ref = x[..., c]
        if degrees:
            ref = np.asarray(PIL.fromarray(ref, mode="F").transpose(TRANSPOSE[degrees]))
        np.testing.assert_array_equal(got[..., c], ref)


def test_rotate_90_by_hand():
    # [[1, 2], [3, 4]] turned a quarter counter-clockwise: the right column
    # comes to the top row.
    got = frame(Image(rotate=90), np.array([[1, 2], [3, 4]], np.float32))
    np.testing.assert_array_equal(got, [[2, 4], [1, 3]])


# Crop ---------------------------------------------------------------------------
def test_fraction_crop_by_hand():
    x = rand((10, 20, 3))
    # 0.5 of 10 rows = 5, leftover 5 split 2 before, 3 after; 0.5 of 20 = 10,
    # leftover 10 split 5 and 5.
    np.testing.assert_array_equal(frame(Image(crop=0.5), x), x[2:7, 5:15])
    # 0.9 of 256 = 230.4 -> 230 rows, 13 before and 13 after; 1.0 keeps all.
    y = rand((256, 256))
    np.testing.assert_array_equal(frame(Image(crop=0.9), y), y[13:243, 13:243])
    np.testing.assert_array_equal(frame(Image(crop=1.0), y), y)
    # Halves round up: 0.25 of 10 = 2.5 -> 3 rows, 3 before, 4 after.
    assert frame(Image(crop=0.25), x).shape == (3, 5, 3)
    np.testing.assert_array_equal(frame(Image(crop=0.25), x), x[3:6, 7:12])


def test_pixel_crop_is_a_slice():
    x = rand((12, 16, 3))
    got = frame(Image(crop=(2, 3, 7, 9)), x)  # top, left, height, width
    np.testing.assert_array_equal(got, x[2:9, 3:12])
    # A box outside the image fails when the frame is built, naming both.
    with pytest.raises(ValueError, match=r"crop=\(6, 0, 7, 9\).*outside the 12x16"):
        frame(Image(crop=(6, 0, 7, 9)), x)


# Resize -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, size",
    [
        ((10, 12, 3), (16, 20)),  # grow
        ((32, 24, 3), (16, 12)),  # shrink by 2
        ((20, 30), (7, 11)),  # shrink by odd factors, no channel axis
        ((256, 256, 3), (224, 224)),  # LIBERO's camera to openpi's input
    ],
)
def test_stretch_matches_pil_bilinear(shape, size):
    x = rand(shape)
    got = frame(Image(size=size), x)
    assert got.shape == size + shape[2:]
    np.testing.assert_allclose(got, pil_resize(x, size), atol=RESIZE_TOL, rtol=0)
    # The default is stretch: what Image(size=...) did before resize= existed.
    np.testing.assert_array_equal(got, frame(Image(size=size, resize="stretch"), x))


def test_pad_geometry_by_hand():
    # 4x8 into 8x8: the ratio is 1, no resize; 4 zero rows split 2 and 2.
    x = rand((4, 8, 3))
    want = np.pad(x, ((2, 2), (0, 0), (0, 0)))
    np.testing.assert_array_equal(frame(Image(size=(8, 8), resize="pad"), x), want)
    # 3x8 into 8x8: 5 zero rows, the odd one after (2 before, 3 after).
    y = rand((3, 8))
    np.testing.assert_array_equal(
        frame(Image(size=(8, 8), resize="pad"), y), np.pad(y, ((2, 3), (0, 0)))
    )


@pytest.mark.parametrize(
    "shape, size",
    [
        ((256, 320, 3), (224, 224)),  # wide: zero rows above and below
        ((320, 256, 3), (224, 224)),  # tall: zero columns
        ((230, 288, 3), (224, 224)),  # 223.99... columns: int() truncates to 223
        ((10, 15), (32, 32)),  # grows to 21x32
        ((480, 640, 3), (224, 224)),  # a 4:3 camera
    ],
)
def test_pad_matches_openpi_resize_with_pad_on_pil(shape, size):
    x = rand(shape)
    got = frame(Image(size=size, resize="pad"), x)
    assert got.shape == size + shape[2:]
    want = pil_resize_with_pad(x, size)
    np.testing.assert_allclose(got, want, atol=RESIZE_TOL, rtol=0)
    # The padding itself is exactly zero where the reference pasted nothing.
    np.testing.assert_array_equal(got[want == 0], 0)


def test_pad_on_uint8_is_within_one_level_of_openpi():
    # openpi resizes the uint8 image in PIL (8-bit result); jaxmesh resizes the
    # /255 floats and keeps them: at most one 8-bit level apart.
    x = RNG.integers(0, 256, (256, 320, 3), dtype=np.uint8)
    got = frame(Image(size=(224, 224), resize="pad"), x)
    ref = np.stack(
        [np.asarray(_openpi_uint8(x[..., c], 224, 224)) for c in range(3)], -1
    )
    assert np.abs(got * 255 - ref).max() <= 1.0


def _openpi_uint8(channel, height, width):
    """openpi's _resize_with_pad_pil on one 8-bit channel ("L" mode)."""
    img = PIL.fromarray(channel)
    ratio = max(img.width / width, img.height / height)
    rh, rw = int(img.height / ratio), int(img.width / ratio)
    small = img.resize((rw, rh), resample=PIL.Resampling.BILINEAR)
    canvas = PIL.new(small.mode, (width, height), 0)
    canvas.paste(small, (int((width - rw) / 2), int((height - rh) / 2)))
    return canvas


def test_crop_resize_geometry_by_hand():
    # 4x8 to cover 4x4: the ratio is 1, no resize; columns 2:6 kept.
    x = rand((4, 8, 3))
    got = frame(Image(size=(4, 4), resize="crop"), x)
    np.testing.assert_array_equal(got, x[:, 2:6])
    # 5x4 to cover 2x4: the width sets the ratio (1), no resize; 3 rows cut,
    # 1 before and 2 after.
    y = rand((5, 4))
    np.testing.assert_array_equal(frame(Image(size=(2, 4), resize="crop"), y), y[1:3])


@pytest.mark.parametrize(
    "shape, size, cover, box",
    [
        # 256x320 covers 224x224 at 224x280: columns 28:252 kept.
        ((256, 320, 3), (224, 224), (224, 280), (0, 28)),
        # 12x10 covers 30x30 at 36x30: rows 3:33 kept.
        ((12, 10), (30, 30), (36, 30), (3, 0)),
    ],
)
def test_crop_resize_matches_pil_then_centre_slice(shape, size, cover, box):
    x = rand(shape)
    got = frame(Image(size=size, resize="crop"), x)
    top, left = box
    want = pil_resize(x, cover)[top : top + size[0], left : left + size[1]]
    np.testing.assert_allclose(got, want, atol=RESIZE_TOL, rtol=0)


# The order: crop -> rotate -> dtype -> resize ---------------------------------------
def test_libero_pipeline_matches_numpy_then_pil_in_order():
    x = RNG.integers(0, 256, (256, 320, 3), dtype=np.uint8)
    decl = Image(size=(224, 224), resize="pad", rotate=180, crop=0.9)
    got = frame(decl, x)
    # 0.9 of 256 x 320 = 230 x 288 (rows 13:243, cols 16:304); rotate 180 is a
    # flip of both axes; then openpi's letterbox of the /255 floats.
    ref = x[13:243, 16:304][::-1, ::-1].astype(np.float32) / 255
    np.testing.assert_allclose(
        got, pil_resize_with_pad(ref, (224, 224)), atol=RESIZE_TOL, rtol=0
    )
    assert decl.steps(x.shape, x.dtype) == [
        "crop 0.9 (rows 13:243, cols 16:304 of 256x320)",
        "rotate 180 ccw",
        "float32 /255",
        "resize pad (224, 224) (fit 178x223, zero rows 23+23, cols 0+1)",
    ]
    # Rotating after the letterbox would put the odd zero column on the left.
    assert np.all(got[:, -1] == 0) and not np.all(got[:, 0] == 0)


def test_rotate_90_swaps_the_sides_before_the_resize():
    x = rand((20, 10, 3))
    got = frame(Image(size=(5, 10), rotate=90), x)  # 10x20 after rotating
    want = pil_resize(np.rot90(x, 1, axes=(0, 1)), (5, 10))
    np.testing.assert_allclose(got, want, atol=RESIZE_TOL, rtol=0)


def test_dtype_and_unchanged_sizes():
    x = RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    decl = Image(size=(8, 8), resize="pad", dtype=jnp.bfloat16)
    out = jax.jit(decl.frame)(x)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), x / 255, rtol=1e-2)
    assert decl.steps(x.shape, x.dtype) == ["bfloat16 /255"]
    depth = np.full((4, 6), 1000, np.int16)
    assert Image(rotate=270).steps(depth.shape, depth.dtype) == [
        "rotate 270 ccw",
        "float32 (values kept)",
    ]
    np.testing.assert_array_equal(frame(Image(rotate=270), depth), 1000.0)


# Bad arguments ------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"crop": 0}, r"crop=0\): crop must be a centre-crop fraction f with 0 < f"),
        ({"crop": 1.5}, r"crop=1.5\)"),
        ({"crop": -0.1}, r"crop=-0.1\)"),
        ({"crop": True}, r"crop=True\)"),
        ({"crop": (1, 2, 3)}, r"crop=\(1, 2, 3\)\).*\(top, left, height, width\)"),
        ({"crop": (0, 0, 0, 4)}, r"crop=\(0, 0, 0, 4\)\)"),
        ({"crop": (-1, 0, 2, 2)}, r"crop=\(-1, 0, 2, 2\)\)"),
        ({"crop": (0, 0, 2.5, 2)}, r"crop=\(0, 0, 2.5, 2\)\)"),
        ({"crop": "center"}, r"crop='center'\)"),
        ({"rotate": 45}, r"rotate=45\): rotate must be 0, 90, 180 or 270"),
        ({"rotate": -90}, r"rotate=-90\)"),
        ({"rotate": True}, r"rotate=True\)"),
        ({"resize": "fit", "size": (4, 4)}, r"resize='fit'\): .*'stretch', 'pad'"),
        ({"resize": "pad"}, r"resize='pad'\) needs size=\(height, width\)"),
        ({"size": (4, True)}, r"size=\(4, True\)\)"),
    ],
)
def test_bad_values_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Image(**kwargs)


def test_a_run_with_the_openpi_preprocessing():
    # In a run the frame is built inside the jitted step: a policy that reports
    # the letterbox's zero rows sees them on every step.
    class Cam:
        name = "cam"
        action_shape = ()
        action_dtype = jnp.int32
        num_actions = 2

        def reset(self, key):
            return {"rgb": jnp.full((6, 12, 3), 255, jnp.uint8)}, jnp.int32(0)

        def step(self, key, t, action):
            obs, _ = self.reset(key)
            return obs, t + 1, action.astype(jnp.float32), t + 1 >= 3, jnp.bool_(False)

    # 6x12 into 12x12: fit 6x12, zero rows 3+3; the top-left pixel is padding.
    spec = {"img": Image(key="rgb", size=(12, 12), resize="pad", rotate=180)}
    model = jaxmesh.Model(
        lambda o: (o["img"][0, 0, 0] == 0).astype(jnp.int32), spec=spec
    )
    result = jaxmesh.evaluate(model, Cam(), num_envs=1, episodes=2)
    np.testing.assert_array_equal(result.returns, [3.0, 3.0])
