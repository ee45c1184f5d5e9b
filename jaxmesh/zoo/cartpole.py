"""A small MLP policy for gymnax ``CartPole-v1``, its weights trained with
``python -m jaxmesh.zoo.train_cartpole`` shipped (``docs/cli.md``).

Example::

    import jaxmesh
    from jaxmesh.zoo import cartpole

    policy = cartpole.CartPoleMLP()
    result = jaxmesh.evaluate(policy, "gymnax:CartPole-v1", episodes=1000)

    # Or as a plain function of (params, obs), e.g. for make_evaluator:
    params = jaxmesh.load_params(cartpole.DEFAULT_PATH)
    run = jaxmesh.make_evaluator(cartpole.apply, "gymnax:CartPole-v1", episodes=16)
    returns = run(params).returns
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxmesh.zoo.shipped import ShippedWeights

DEFAULT_PATH = Path(__file__).resolve().parent / "checkpoints" / "cartpole_mlp"

OBS_SIZE = 4
NUM_ACTIONS = 2


class CartPoleNet(nn.Module):
    """Observation -> action logits: tanh hidden layers, a linear head."""

    hidden: Sequence[int] = (64, 64)
    num_actions: int = NUM_ACTIONS

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = jnp.asarray(obs, jnp.float32)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        return nn.Dense(self.num_actions)(x)


def init(key: jax.Array) -> Any:
    """Fresh (untrained) params of ``CartPoleNet()``."""
    return CartPoleNet().init(key, jnp.zeros((OBS_SIZE,), jnp.float32))


def apply(params: Any, obs: jax.Array) -> jax.Array:
    """The greedy int32 action for one observation (or a batch) with
    ``CartPoleNet()``'s params."""
    logits = CartPoleNet().apply(params, obs)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


class CartPoleMLP(ShippedWeights):
    """The trained CartPole MLP as a ``jaxmesh.Model`` (``CartPoleMLP()``: the
    shipped weights; ``from_config(checkpoint=...)``: others)."""

    DEFAULT_PATH = DEFAULT_PATH

    def predict(self, obs: jax.Array) -> jax.Array:
        return apply(self.params, obs)


__all__ = ["CartPoleNet", "init", "apply", "CartPoleMLP", "DEFAULT_PATH"]
