"""A small convolutional Atari policy with fixed random (untrained) weights on
EnvPool's ``[4, 84, 84]`` uint8 frames: it scores as a random policy (Pong:
about -21) and shows the protocol end to end (``configs/pong.yaml``) with a
real network's shapes and cost.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.cache
def weights(num_actions: int = 6, seed: int = 0) -> dict:
    """DQN's first Atari network, He-scaled normal draws (numpy, so the first
    call may come from inside a trace)."""
    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {
        "c1": he((16, 4, 8, 8), 4 * 8 * 8),
        "c2": he((32, 16, 4, 4), 16 * 4 * 4),
        "d1": he((32 * 9 * 9, 256), 32 * 9 * 9),
        "d2": he((256, num_actions), 256),
    }


def logits(obs: jax.Array, num_actions: int = 6) -> jax.Array:
    """``[4, 84, 84]`` uint8 frames -> ``[num_actions]`` scores, convolving
    channels-last, the layout XLA:CPU runs fast in loops (``core.convs``)."""
    w = weights(num_actions)
    x = jnp.transpose(obs.astype(jnp.float32), (1, 2, 0))[None] / 255.0
    conv = functools.partial(
        jax.lax.conv_general_dilated,
        padding="VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    hwio = lambda k: np.transpose(k, (2, 3, 1, 0))
    x = jax.nn.relu(conv(x, hwio(w["c1"]), (4, 4)))  # [1, 20, 20, 16]
    x = jax.nn.relu(conv(x, hwio(w["c2"]), (2, 2)))  # [1, 9, 9, 32]
    # Flattened channel-major, as the weights' rows are laid out.
    x = jax.nn.relu(jnp.transpose(x, (0, 3, 1, 2)).reshape(-1) @ w["d1"])
    return x @ w["d2"]


def pong(obs: jax.Array) -> jax.Array:
    """The greedy action of ``logits`` for Pong's 6 actions (int32)."""
    return jnp.argmax(logits(obs, 6)).astype(jnp.int32)
