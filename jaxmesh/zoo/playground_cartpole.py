"""A hand-made linear controller for Playground's ``CartpoleBalance``.

Not trained: a linear state-feedback law on the env's 5 observations
(cart position, cos and sin of the pole angle, cart velocity, pole angular
velocity), squashed to the action range [-1, 1] with ``tanh``. It keeps the
pole up for the whole 1000-step episode from every reset
(``configs/playground_cartpole.yaml`` scores it).

Example::

    import jaxmesh
    from jaxmesh.zoo import playground_cartpole

    result = jaxmesh.evaluate(
        playground_cartpole.balance, "playground:CartpoleBalance", episodes=100
    )
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: Gains on (cart position, cos, sin, cart velocity, pole angular velocity).
GAINS = jnp.array([0.3, 0.0, 3.0, 0.5, 0.6], jnp.float32)


def balance(obs: jax.Array) -> jax.Array:
    """One action, shape (1,), in [-1, 1]."""
    return jnp.tanh(jnp.dot(GAINS, obs))[None]
