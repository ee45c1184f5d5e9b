"""hostsim's workload B simulator, in a module of its own that imports numpy and
gymnasium only, as a simulator's module does: a worker process imports the
module of the factory it is given, and ``hostsim`` imports JAX (about a second
of every worker's start, which no simulator package costs)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


def burn(loops: int) -> int:
    """Pure-Python CPU work: ``loops`` iterations of integer arithmetic."""
    x = 0
    for i in range(loops):
        x = (x + i * i) & 0xFFFF
    return x


def calibrate(ms: float) -> int:
    """Loops of :func:`burn` that take ~``ms`` milliseconds here (best of 7)."""
    probe = 20_000
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        burn(probe)
        best = min(best, time.perf_counter() - t0)
    return max(1, int(probe * ms / 1000.0 / best))


class BusyEnv(gym.Env):
    """A heavy Python simulator: each step burns ``loops`` of pure-Python CPU.

    Observations are a Dict {"image": uint8 [64, 64, 3], "state": float32 [8]};
    the state drifts toward the (tiled) 2-dim action, reward is minus its
    squared norm; episodes are truncated after ``episode_steps`` steps.
    """

    metadata = {"render_modes": []}

    def __init__(self, loops: int = 1000, episode_steps: int = 30):
        self.loops, self.episode_steps = loops, episode_steps
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
                "state": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._state = np.zeros(8, np.float32)
        self._t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        image = np.full((64, 64, 3), self._t % 256, np.uint8)
        return {"image": image, "state": self._state.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._state = self.np_random.normal(0.0, 1.0, 8).astype(np.float32)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        burn(self.loops)
        a = np.asarray(action, np.float32)
        self._state = (0.9 * self._state + 0.1 * np.tile(a, 4)).astype(np.float32)
        self._t += 1
        reward = -float(np.sum(self._state**2))
        return self._obs(), reward, False, self._t >= self.episode_steps, {}
