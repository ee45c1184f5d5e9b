"""jaxmesh.explain and the frame-history limit, with byte counts worked out by
hand (frame elements x dtype size x stack, per lane, times the lanes)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import jaxmesh
from jaxmesh.adapt import Image, Previous, State
from jaxmesh.explain import LIMIT_ENV, check_frame_limit, explain


class Robot:
    """A tiny dict-observation env: a uint8 camera, joints, and a leaf no spec
    reads; continuous 2-D actions."""

    name = "robot"
    action_shape = (2,)
    action_dtype = jnp.float32
    num_actions = None

    def reset(self, key):
        obs = {
            "rgb": jnp.zeros((32, 32, 3), jnp.uint8),
            "joints": jnp.zeros((7,), jnp.float32),
            "extra": jnp.zeros((5,), jnp.int16),
        }
        return obs, jnp.int32(0)

    def step(self, key, state, action):
        obs, _ = self.reset(key)
        return obs, state + 1, jnp.float32(0), jnp.bool_(False), jnp.bool_(False)


SPEC = {
    "image": Image(key="rgb", size=(8, 8), stack=2, dtype=jnp.bfloat16),
    "joints": State(key="joints", stack=3),
    "prev": Previous(),
}
# image: 8*8*3 bf16 = 384 B x 2 = 768; joints: 7 f32 = 28 B x 3 = 84;
# prev: 2 f32 = 8 B. Per lane 860.
PER_LANE = 768 + 84 + 8


def test_dict_env_spec_counts_by_hand():
    ex = explain(SPEC, Robot(), num_envs=5)
    assert ex.leaves == ["rgb", "joints"]  # "extra" is never read
    image, joints, prev = ex.inputs["image"], ex.inputs["joints"], ex.inputs["prev"]
    assert (image.kind, image.key, image.shape, image.dtype) == (
        "Image",
        "rgb",
        (8, 8, 3),
        "bfloat16",
    )
    assert (image.stack, image.window_shape, image.bytes_per_lane) == (
        2,
        (2, 8, 8, 3),
        768,
    )
    assert (joints.shape, joints.dtype, joints.window_shape) == (
        (7,),
        "float32",
        (3, 7),
    )
    assert joints.bytes_per_lane == 84
    assert (prev.kind, prev.key, prev.shape, prev.dtype, prev.bytes_per_lane) == (
        "Previous",
        None,
        (2,),
        "float32",
        8,
    )
    assert ex.bytes_per_lane == PER_LANE
    assert ex.total_bytes == 5 * PER_LANE
    assert ex.num_envs == 5 and ex.env == "robot" and ex.policy is None


def test_image_without_size_and_uint8_becomes_float32():
    ex = explain({"cam": Image(key="rgb")}, Robot())
    cam = ex.inputs["cam"]
    assert (cam.shape, cam.dtype, cam.bytes_per_lane) == ((32, 32, 3), "float32", 12288)


def test_whole_dict_observation_is_a_tree_of_leaves():
    ex = explain({"all": State()}, Robot(), num_envs=2)
    info = ex.inputs["all"]
    assert ex.leaves == [None]
    assert info.shape == {"rgb": (32, 32, 3), "joints": (7,), "extra": (5,)}
    assert info.dtype == {"rgb": "uint8", "joints": "float32", "extra": "int16"}
    assert info.bytes_per_lane == 3072 + 28 + 10
    assert ex.total_bytes == 2 * 3110


def test_no_spec_reads_the_whole_observation():
    ex = explain(None, "gymnax:CartPole-v1", num_envs=10)
    assert ex.leaves == [None]
    (info,) = ex.inputs.values()
    assert (info.shape, info.dtype, info.stack, info.bytes_per_lane) == (
        (4,),
        "float32",
        1,
        16,
    )
    assert ex.total_bytes == 160
    assert "whole observation" in str(ex)
    # A plain policy function has no spec either.
    assert explain(lambda obs: 0, "gymnax:CartPole-v1").bytes_per_lane == 16


def test_minatar_image_stack_by_hand():
    spec = {"img": Image(size=(16, 16), stack=4), "prev": Previous(stack=3)}
    ex = explain(spec, "gymnax:Breakout-MinAtar", num_envs=64)
    # img: 16*16*4 floats * 4 B * 4 frames = 16384; prev: int32 * 3 = 12.
    assert ex.inputs["img"].window_shape == (4, 16, 16, 4)
    assert ex.inputs["prev"].window_shape == (3,)
    assert ex.bytes_per_lane == 16384 + 12
    assert ex.total_bytes == 64 * 16396


def test_model_explain_uses_the_spec_set_by_load():
    class Late(jaxmesh.Model):
        def load(self):
            self.spec = {"joints": State(key="joints", stack=4)}

        def predict(self, obs):
            return jnp.zeros((2,))

    ex = Late().explain(Robot(), num_envs=3)
    assert ex.policy == "Late" and ex.leaves == ["joints"]
    assert ex.bytes_per_lane == 4 * 28 and ex.total_bytes == 3 * 112


def test_str_and_to_dict():
    ex = explain(SPEC, Robot(), num_envs=5)
    text = str(ex)
    assert text.splitlines()[0] == "explain: robot, 5 lane(s)"
    assert "reads: 'rgb', 'joints'" in text
    assert "image   Image     rgb     (8, 8, 3)  bfloat16  2      768" in text
    assert "860 B per lane; 4.20 KiB (4,300 B) for 5 lane(s) (within the" in text
    # uint8 -> bfloat16 in [0, 1], then stretched 32x32 -> 8x8.
    assert "preprocessing:\n  image: bfloat16 /255 -> resize stretch (8, 8)\n" in text
    d = json.loads(json.dumps(ex.to_dict()))
    assert d["inputs"]["image"]["window_shape"] == [2, 8, 8, 3]
    assert d["total_bytes"] == 5 * PER_LANE and d["leaves"] == ["rgb", "joints"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_envs=0"):
        explain(SPEC, Robot(), num_envs=0)
    with pytest.raises(TypeError, match="expected a spec dict"):
        explain(3, Robot())
    with pytest.raises(ValueError, match=r"its keys are \['extra', 'joints', 'rgb'\]"):
        explain({"d": State(key="depth")}, Robot())


# The frame-history limit ------------------------------------------------------------
def test_limit_refusal_names_figure_limit_and_remedy(monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, "1000")
    assert check_frame_limit(SPEC, Robot(), 1).total_bytes == PER_LANE
    with pytest.raises(ValueError) as e:
        check_frame_limit(SPEC, Robot(), num_envs=2)
    msg = str(e.value)
    assert "the frame windows of 2 lanes would hold 1.68 KiB (1,720 B)" in msg
    assert "(860 B per lane), over the limit of 1,000 B" in msg
    assert LIMIT_ENV in msg
    assert "largest input is 'image' (Image, window (2, 8, 8, 3) bfloat16" in msg
    assert "Use at most 1 lanes (num_envs), a smaller stack or Image size" in msg


def test_default_limit_is_two_gib(monkeypatch):
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    # 256*256*4 floats * 4 B * 8 frames = 8 MiB per lane: 256 lanes = 2 GiB fit,
    # 257 do not.
    spec = {"big": Image(size=(256, 256), stack=8)}
    ex = check_frame_limit(spec, "gymnax:Breakout-MinAtar", 256)
    assert ex.bytes_per_lane == 8 * 1024**2 and ex.limit_bytes == 2 * 1024**3
    with pytest.raises(ValueError, match=r"2.01 GiB .* over the limit of 2.00 GiB"):
        check_frame_limit(spec, "gymnax:Breakout-MinAtar", 257)


@pytest.mark.parametrize("value", ["lots", "-5", "1.5"])
def test_bad_limit_variable(monkeypatch, value):
    monkeypatch.setenv(LIMIT_ENV, value)
    with pytest.raises(ValueError, match=f"{LIMIT_ENV}='{value}'"):
        explain(SPEC, Robot())


def test_evaluate_refuses_over_the_limit_before_compiling(monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, "100")
    model = jaxmesh.Model(
        lambda obs: jnp.zeros((2,)), spec={"joints": State(key="joints", stack=4)}
    )
    compiled = []

    def listen(name, *args, **kwargs):
        if "backend_compile" in name:
            compiled.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        with pytest.raises(ValueError, match="over the limit of 100 B"):
            jaxmesh.evaluate(model, Robot(), num_envs=4, episodes=4)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiled == []


# What each image input goes through -----------------------------------------------
class Libero:
    """LIBERO's observation as robosuite gives it: 256x256 uint8 cameras, the
    third-person one upside down, and a float32 depth map."""

    name = "libero"
    action_shape = (7,)
    action_dtype = jnp.float32
    num_actions = None

    def reset(self, key):
        obs = {
            "agentview_image": jnp.zeros((256, 256, 3), jnp.uint8),
            "wrist_image": jnp.zeros((256, 256, 3), jnp.uint8),
            "depth": jnp.zeros((128, 128), jnp.float32),
        }
        return obs, jnp.int32(0)

    def step(self, key, state, action):
        obs, _ = self.reset(key)
        return obs, state + 1, jnp.float32(0), jnp.bool_(False), jnp.bool_(False)


def test_every_image_transform_is_listed_in_order():
    spec = {
        "image": Image("agentview_image", size=(224, 224), resize="pad", rotate=180),
        "wrist": Image("wrist_image", size=(224, 224), crop=0.9),
        "depth": Image("depth"),
        "prev": Previous(),
    }
    ex = explain(spec, Libero())
    # 256 -> 224 by 0.875 on both sides: no padding is left; 0.9 of 256 = 230
    # rows, 13 either side.
    image = [
        "rotate 180 ccw",
        "float32 /255",
        "resize pad (224, 224) (fit 224x224, zero rows 0+0, cols 0+0)",
    ]
    wrist = [
        "crop 0.9 (rows 13:243, cols 13:243 of 256x256)",
        "float32 /255",
        "resize stretch (224, 224)",
    ]
    assert ex.inputs["image"].steps == image
    assert ex.inputs["wrist"].steps == wrist
    assert ex.inputs["depth"].steps == [] and ex.inputs["prev"].steps == []
    assert ex.inputs["image"].shape == ex.inputs["wrist"].shape == (224, 224, 3)
    lines = str(ex).splitlines()
    at = lines.index("preprocessing:")
    assert lines[at + 1 : at + 4] == [
        "  image: " + " -> ".join(image),
        "  wrist: " + " -> ".join(wrist),
        "  depth: as read",
    ]
    assert lines[at + 4].startswith("frame windows:")
    assert ex.to_dict()["inputs"]["wrist"]["steps"] == wrist


def test_a_crop_box_outside_the_image_fails_in_explain():
    with pytest.raises(ValueError, match=r"crop=\(200, 0, 100, 100\).*256x256"):
        explain({"i": Image("wrist_image", crop=(200, 0, 100, 100))}, Libero())
