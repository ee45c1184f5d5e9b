"""What every policy shipped in ``jaxmesh.zoo`` shares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from jaxmesh.checkpoint import load_params
from jaxmesh.model import Model
from jaxmesh.params import Param


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
