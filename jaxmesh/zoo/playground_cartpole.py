"""Policies for MuJoCo Playground's ``CartpoleBalance`` (5 observations, one
action in [-1, 1]): ``CartpoleMLP``, its weights trained with ``python -m
jaxmesh.zoo.train_playground_cartpole`` shipped, and ``balance``, a linear law
squashed with ``tanh`` (``configs/playground_cartpole*.yaml`` score them;
docs/playground.md, "A trained policy").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxmesh.zoo.shipped import ShippedWeights

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


class CartpoleBalanceNet(nn.Module):
    """Observation -> action in [-1, 1]: tanh hidden layers, a tanh head."""

    hidden: Sequence[int] = (32, 32)
    action_size: int = ACTION_SIZE

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = jnp.asarray(obs, jnp.float32)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        return nn.tanh(nn.Dense(self.action_size)(x))


def init(key: jax.Array) -> Any:
    """Fresh (untrained) params of ``CartpoleBalanceNet()``."""
    return CartpoleBalanceNet().init(key, jnp.zeros((OBS_SIZE,), jnp.float32))


def apply(params: Any, obs: jax.Array) -> jax.Array:
    """The action, shape (1,) in [-1, 1], for one observation (or a batch)
    with ``CartpoleBalanceNet()``'s params."""
    return CartpoleBalanceNet().apply(params, obs)


class CartpoleMLP(ShippedWeights):
    """The trained ``CartpoleBalance`` MLP as a ``jaxmesh.Model``."""

    DEFAULT_PATH = DEFAULT_PATH

    def predict(self, obs: jax.Array) -> jax.Array:
        return apply(self.params, obs)


__all__ = [
    "CartpoleBalanceNet",
    "init",
    "apply",
    "balance",
    "CartpoleMLP",
    "DEFAULT_PATH",
    "GAINS",
]
