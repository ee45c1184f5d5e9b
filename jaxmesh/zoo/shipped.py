"""What every policy shipped in ``jaxmesh.zoo`` shares."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxmesh.checkpoint import load_params
from jaxmesh.model import Model
from jaxmesh.params import Param


class MLP(nn.Module):
    """Observation -> ``out`` numbers: tanh hidden layers, a linear head
    (``squash``: a tanh head, in [-1, 1])."""

    hidden: Sequence[int]
    out: int
    squash: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = jnp.asarray(obs, jnp.float32)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        x = nn.Dense(self.out)(x)
        return nn.tanh(x) if self.squash else x


class ShippedWeights(Model):
    """A ``jaxmesh.Model`` whose weights ship with jaxmesh (``DEFAULT_PATH``):
    ``Cls()`` loads them, ``Cls.from_config(checkpoint=...)`` others
    (FileNotFoundError when missing)."""

    DEFAULT_PATH: ClassVar[Path]

    checkpoint = Param(
        None,
        type=(str, type(None)),
        doc="orbax checkpoint directory of the weights; null: the shipped one",
    )

    def load(self, checkpoint: str | os.PathLike | None = None) -> None:
        path = Path(self.DEFAULT_PATH if checkpoint is None else checkpoint)
        self.params = load_params(path)
