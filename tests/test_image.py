"""Image inputs on a gymnax MinAtar game (Breakout-MinAtar, (10, 10, 4) frames):
``Image(size=(16, 16), stack=4)`` against a plain Python loop that resizes each
frame with ``jax.image.resize`` and stacks the last four; and a spec naming a key
the env does not have.

The policies are exact: resized MinAtar frames hold multiples of 1/256 (the
bilinear weights of 10 -> 16 are multiples of 1/16), and the projections use
small integer weights, so every float sum is exact whatever its order or batch.
"""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import assert_matches, gymnax_fns, run_episode

import jaxmesh
from jaxmesh.adapt import Image, Previous, State

BREAKOUT = gymnax.make("Breakout-MinAtar")
SIDE, STACK, ACTIONS = 16, 4, 3
SEEDS = [0, 1, 2]
CAP = 400  # max_episode_steps: keeps the reference loop short

_w = np.random.default_rng(0).integers(-2, 3, (STACK * SIDE * SIDE * 4, 2 * ACTIONS))
W = jnp.asarray(_w, jnp.float32)


def scores(image):
    """[STACK, 16, 16, 4] -> two rows of action scores, exactly."""
    return (image.reshape(-1) @ W).reshape(2, ACTIONS)


def act(image, bias=0.0):
    """Follow the ball with the paddle (columns of the newest frame); when level,
    the best action of the projected stack. Column sums and argmax are exact."""
    cols = image[-1].sum(axis=0)  # [16, 4]: per column, per channel
    move = jnp.argmax(cols[:, 1]) - jnp.argmax(cols[:, 0])  # ball - paddle
    best = jnp.argmax(scores(image)[0] + bias)
    return jnp.where(move < 0, 1, jnp.where(move > 0, 2, best)).astype(jnp.int32)


def resize(frame):
    """The reference frame: float in [0, 1], resized by jax.image.resize."""
    frame = jnp.asarray(frame)
    if frame.dtype == jnp.uint8:
        frame = frame.astype(jnp.float32) / 255.0
    return jax.image.resize(frame.astype(jnp.float32), (SIDE, SIDE, 4), "bilinear")


def window(frames, t):
    """The last STACK frames up to step t, oldest first, reset frame repeated."""
    return np.stack([frames[max(i, 0)] for i in range(t - STACK + 1, t + 1)])


def test_stacked_resized_frames_match_reference():
    def policy(obs):
        return act(obs["image"])

    model = jaxmesh.Model(policy, spec={"image": Image(size=(SIDE, SIDE), stack=4)})
    result = jaxmesh.evaluate(
        model, BREAKOUT, num_envs=2, seeds=SEEDS, max_episode_steps=CAP
    )

    plan = jax.jit(lambda frames: act(jax.vmap(resize)(frames))[None])
    refs = [
        run_episode(
            *gymnax_fns(*BREAKOUT),
            lambda frames, key: plan(frames),
            seed,
            cap=CAP,
            inputs=lambda obs_h, act_h, t: window(obs_h, t),
        )
        for seed in SEEDS
    ]
    assert len({r.length for r in refs}) > 1
    assert len(np.unique(np.concatenate([np.asarray(r.actions) for r in refs]))) > 1
    assert_matches(result, refs)


class PixelsBreakout:
    """Breakout-MinAtar with a dict observation: uint8 ``pixels`` and the
    ball's ``ball`` position (a jaxmesh env: reset/step, never auto-resets)."""

    name = "pixels-breakout"
    action_shape = ()
    action_dtype = jnp.int32
    num_actions = ACTIONS

    def __init__(self):
        self.env, self.params = BREAKOUT

    def _obs(self, obs, state):
        return {
            "pixels": (obs * 255).astype(jnp.uint8),
            "ball": jnp.stack([state.ball_x, state.ball_y]).astype(jnp.int32),
        }

    def reset(self, key):
        obs, state = self.env.reset_env(key, self.params)
        return self._obs(obs, state), state

    def step(self, key, state, action):
        obs, state, reward, done, _ = self.env.step_env(key, state, action, self.params)
        truncated = self.env.is_truncated(state, self.params)
        return self._obs(obs, state), state, reward.astype(jnp.float32), done, truncated


def test_dict_obs_uint8_pixels_with_chunks_and_previous_action():
    # Chunks of 2 played whole: the window must advance on replayed steps too.
    spec = {
        "image": Image(key="pixels", size=(SIDE, SIDE), stack=STACK),
        "ball": State(key="ball"),
        "prev": Previous(),
    }

    def chunk(image, ball, prev):
        # Then, a second action from the other projection, the ball's state
        # and the previous action.
        extra = jnp.stack([ball[0] - ball[1], prev, 1 - prev])
        second = jnp.argmax(scores(image)[1] + extra).astype(jnp.int32)
        return jnp.stack([act(image, bias=extra), second])

    model = jaxmesh.Model(lambda o: chunk(**o), spec=spec, native_chunk=2)
    env = PixelsBreakout()
    result = jaxmesh.evaluate(
        model, env, num_envs=2, seeds=SEEDS, horizon=2, max_episode_steps=CAP
    )

    plan = jax.jit(
        lambda frames, ball, prev: chunk(jax.vmap(resize)(frames), ball, prev)
    )

    def inputs(obs_h, act_h, t):
        frames = window([o["pixels"] for o in obs_h], t)
        prev = np.int32(act_h[t - 1] if t > 0 else 0)
        return frames, obs_h[t]["ball"], prev

    refs = [
        run_episode(
            jax.jit(env.reset),
            jax.jit(env.step),
            lambda x, key: plan(*x),
            seed,
            horizon=2,
            cap=CAP,
            inputs=inputs,
        )
        for seed in SEEDS
    ]
    assert len({r.length for r in refs}) > 1
    assert_matches(result, refs)


def test_a_missing_key_fails_before_compiling_listing_the_env_keys():
    model = jaxmesh.Model(
        lambda o: jnp.int32(0), spec={"image": Image(key="rgb", size=(8, 8))}
    )
    with pytest.raises(ValueError, match=r"no such key; its keys are \['ball', 'p"):
        jaxmesh.evaluate(model, PixelsBreakout(), episodes=1)
    with pytest.raises(ValueError, match=r"Image\(key='rgb'\)"):
        jaxmesh.explain(model, PixelsBreakout())
    # A key on an env whose observation is one array (not a dict).
    with pytest.raises(ValueError, match="reads a dict key, but the env observation"):
        jaxmesh.explain({"x": State(key="x")}, BREAKOUT)


@pytest.mark.parametrize(
    "dtype, values, want",
    [
        # 8-bit pixels: divided by 255 into [0, 1].
        (jnp.uint8, [0, 51, 255], [0.0, 0.2, 1.0]),
        # Anything else keeps its values: a depth map in millimetres stays one.
        (jnp.int16, [0, 1000, -7], [0.0, 1000.0, -7.0]),
        (jnp.int32, [0, 40000, 3], [0.0, 40000.0, 3.0]),
        (jnp.float32, [0.5, 300.0, -1.0], [0.5, 300.0, -1.0]),
        (jnp.bool_, [False, True, True], [0.0, 1.0, 1.0]),
    ],
)
def test_only_uint8_images_are_rescaled(dtype, values, want):
    img = jnp.asarray([values, values], dtype)  # (2, 3)
    frame = Image().frame(img)
    assert frame.dtype == jnp.float32
    np.testing.assert_allclose(frame, [want, want], rtol=1e-7)
    # dtype= converts after the rescale (uint8) or as it is (the rest).
    half = Image(dtype=jnp.float16).frame(img)
    assert half.dtype == jnp.float16
    np.testing.assert_allclose(half, [want, want], rtol=1e-3)


class Ramp:
    """A 5-step episode whose observation at step t is a 2x2 ``depth`` map of
    ``300 * t`` (int16, millimetres) and ``pixels`` of ``51 * t`` (uint8)."""

    name = "ramp"
    action_shape = ()
    action_dtype = jnp.int32
    num_actions = 2

    def _obs(self, t):
        return {
            "depth": jnp.full((2, 2), 300 * t, jnp.int16),
            "pixels": jnp.full((2, 2), 51 * t, jnp.uint8),
        }

    def reset(self, key):
        return self._obs(0), jnp.int32(0)

    def step(self, key, t, action):
        t = t + 1
        reward = action.astype(jnp.float32)
        return self._obs(t), t, reward, t >= 5, jnp.bool_(False)


def test_int16_depth_keeps_its_values_and_uint8_pixels_are_rescaled_in_a_run():
    # Reward 1 on each step whose plan saw the threshold crossed. Worked by hand
    # over steps t = 0..4: depth 300 t > 500 mm at t = 2, 3, 4 (return 3);
    # pixels 51 t / 255 > 0.5 at t = 3, 4 (return 2). Rescaling the depth by
    # 1/255 would never cross (return 0); not rescaling the pixels would cross
    # at t = 1..4 (return 4).
    depth = jaxmesh.Model(
        lambda o: (o["d"].mean() > 500).astype(jnp.int32),
        spec={"d": Image(key="depth")},
    )
    pixels = jaxmesh.Model(
        lambda o: (o["p"].mean() > 0.5).astype(jnp.int32),
        spec={"p": Image(key="pixels")},
    )
    for model, want in ((depth, 3.0), (pixels, 2.0)):
        result = jaxmesh.evaluate(model, Ramp(), num_envs=2, episodes=3)
        np.testing.assert_array_equal(result.returns, [want] * 3)
        np.testing.assert_array_equal(result.lengths, [5, 5, 5])
