"""Policies for MuJoCo Playground's ``CartpoleBalance`` (5 observations, one
action in [-1, 1]): ``CartpoleMLP``, its weights trained with ``python -m
jaxmesh.zoo.train_playground_cartpole`` shipped, and ``balance``, a linear law
squashed with ``tanh`` (``configs/playground_cartpole*.yaml`` score them;
docs/playground.md, "A trained policy").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh.zoo.shipped import MLP, ShippedWeights

DEFAULT_PATH = (
    Path(__file__).resolve().parent / "checkpoints" / "playground_cartpole_mlp"
)

OBS_SIZE = 5
ACTION_SIZE = 1

#: Gains of ``balance`` on (cart position, cos, sin, cart velocity, pole
#: angular velocity).
GAINS = jnp.array([0.3, 0.0, 3.0, 0.5, 0.6], jnp.float32)


def balance(obs: jax.Array) -> jax.Array:
    """The hand-made controller: one action, shape (1,), in [-1, 1]."""
    return jnp.tanh(jnp.dot(GAINS, obs))[None]


#: Observation -> action in [-1, 1].
NET = MLP(hidden=(32, 32), out=ACTION_SIZE, squash=True)


def init(key: jax.Array) -> Any:
    """Fresh (untrained) params of ``NET``."""
    return NET.init(key, jnp.zeros((OBS_SIZE,), jnp.float32))


def apply(params: Any, obs: jax.Array) -> jax.Array:
    """The action, shape (1,) in [-1, 1], for one observation (or a batch)
    with ``NET``'s params."""
    return NET.apply(params, obs)


class CartpoleMLP(ShippedWeights):
    """The trained ``CartpoleBalance`` MLP as a ``jaxmesh.Model``."""

    DEFAULT_PATH = DEFAULT_PATH

    def predict(self, obs: jax.Array) -> jax.Array:
        return apply(self.params, obs)
