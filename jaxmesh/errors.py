"""Exceptions a run raises once it is under way (bad input raises ValueError /
TypeError before anything compiles)."""

from __future__ import annotations


class BadValueError(ValueError):
    """A bad value met while running: a discrete action out of range, a NaN action,
    a NaN reward from the env.

    Detected on the device (a flag in the scan's carry) and raised after the
    segment it happened in. Attributes name where: ``episode`` (its index),
    ``seed``, ``step`` (0-based env step of the episode), ``lane`` and ``value``;
    ``partial_result`` holds every episode finished before the run stopped.
    """

    def __init__(self, message: str, *, episode, seed, step, lane, value, kind):
        super().__init__(message)
        self.episode = episode
        self.seed = seed
        self.step = step
        self.lane = lane
        self.value = value
        self.kind = kind
        self.partial_result = None
