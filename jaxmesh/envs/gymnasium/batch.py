"""What gymnasium lanes hand back from one call, and names shared with the wire."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: The dtype names a lane's arrays may have (``jaxmesh.remote.codec.DTYPES``).
DTYPE_NAMES: tuple[str, ...] = ("bool", "float16", "float32", "float64") + tuple(
    f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)
)

#: The reset option that carries an episode's trial index to an env that takes it.
TRIAL_INDEX = "trial_index"


class ResultBatch(NamedTuple):
    """What lanes did in one call, as numpy (the wire's ``ResultBatch`` too).

    Attributes:
      lanes: int64 ``[m]``, ascending: every lane reset or stepped.
      steps: int64 ``[m]``: env steps executed (0 for a reset, or for a lane
        whose episode had ended).
      rows: int64 ``[m]``: observation rows: 1 for a reset; for a replay
        ``steps`` rows when every observation is kept, else ``min(steps, 1)``.
      rewards: float64 ``[sum(steps)]``, lane after lane.
      terminated: bool ``[sum(steps)]``.
      truncated: bool ``[sum(steps)]`` (a wall-clock cap sets it too).
      observation: ``{"": array [sum(rows), *obs_shape]}`` when observations
        were asked for, else ``{}``; for a Dict or Tuple observation, leaf
        name -> ``[sum(rows), *leaf_shape]`` for the leaves asked for.
      info: info key -> ``[sum(info rows), ...]`` in the values' own dtype, for
        the keys asked for that some row has as numbers of one shape (zeros
        where a row lacks it).
      info_present: info key -> bool ``[sum(info rows)]`` for a key that some
        rows lack (True: the row has it); a key every row has is not here.
      info_rows: int64 ``[m]``: info rows per lane where they differ from
        ``rows`` (every step's info with only the last observation); None:
        ``rows``.
    """

    lanes: np.ndarray
    steps: np.ndarray
    rows: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    observation: dict[str, np.ndarray]
    info: dict[str, np.ndarray]
    info_present: dict[str, np.ndarray] | None = None
    info_rows: np.ndarray | None = None

    @property
    def info_row_counts(self) -> np.ndarray:
        """int64 ``[m]``: the info rows of each lane (``info_rows`` or ``rows``)."""
        return self.rows if self.info_rows is None else self.info_rows


__all__ = ["DTYPE_NAMES", "TRIAL_INDEX", "ResultBatch"]
