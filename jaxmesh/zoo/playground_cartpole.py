"""Policies for MuJoCo Playground's ``CartpoleBalance``: a trained MLP with its
weights shipped, and a hand-made linear controller to compare it with.

The env has 5 observations (cart position, cos and sin of the pole angle, cart
velocity, pole angular velocity) and one action in [-1, 1].

- ``CartpoleMLP``: a small MLP (two tanh layers of 32) whose weights in
  ``checkpoints/playground_cartpole_mlp`` were trained by evolution strategies
  with ``python -m jaxmesh.zoo.train_playground_cartpole``
  (``configs/playground_cartpole.yaml`` scores it).
- ``balance``: not trained; a linear state-feedback law squashed with ``tanh``
  (``configs/playground_cartpole_linear.yaml`` scores it).

Example::

    import jaxmesh
    from jaxmesh.zoo import playground_cartpole

    result = jaxmesh.evaluate(
        playground_cartpole.CartpoleMLP(), "playground:CartpoleBalance", episodes=100
    )

    # Or as a plain function of (params, obs), e.g. for make_evaluator:
    params = jaxmesh.load_params(playground_cartpole.DEFAULT_PATH)
    run = jaxmesh.make_evaluator(
        playground_cartpole.apply, "playground:CartpoleBalance", episodes=16
    )
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

#: The checkpoint shipped inside the package, found next to this file.
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
    """The action for one observation.

    Args:
      params: the params of ``CartpoleBalanceNet()`` (``init`` or a loaded checkpoint).
      obs: one observation, shape (5,) (a leading batch axis also works).

    Returns:
      The action, float32, shape (1,) (or (B, 1) for a batch), in [-1, 1].
    """
    return CartpoleBalanceNet().apply(params, obs)


class CartpoleMLP(ShippedWeights):
    """The trained ``CartpoleBalance`` MLP as a ``jaxmesh.Model``
    (``CartpoleMLP()``: the shipped weights; ``from_config(checkpoint=...)``:
    others)."""

    DEFAULT_PATH = DEFAULT_PATH

    def predict(self, obs: jax.Array) -> jax.Array:
        """The action for one observation (float32, shape (1,))."""
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
