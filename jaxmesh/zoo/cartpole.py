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

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh.zoo.shipped import MLP, ShippedWeights

DEFAULT_PATH = Path(__file__).resolve().parent / "checkpoints" / "cartpole_mlp"

OBS_SIZE = 4
NUM_ACTIONS = 2


#: Observation -> action logits.
NET = MLP(hidden=(64, 64), out=NUM_ACTIONS)


def init(key: jax.Array) -> Any:
    """Fresh (untrained) params of ``NET``."""
    return NET.init(key, jnp.zeros((OBS_SIZE,), jnp.float32))


def apply(params: Any, obs: jax.Array) -> jax.Array:
    """The greedy int32 action for one observation (or a batch) with
    ``NET``'s params."""
    return jnp.argmax(NET.apply(params, obs), axis=-1).astype(jnp.int32)


class CartPoleMLP(ShippedWeights):
    """The trained CartPole MLP as a ``jaxmesh.Model`` (``CartPoleMLP()``: the
    shipped weights; ``from_config(checkpoint=...)``: others)."""

    DEFAULT_PATH = DEFAULT_PATH

    def predict(self, obs: jax.Array) -> jax.Array:
        return apply(self.params, obs)
