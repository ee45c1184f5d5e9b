"""Module-level gymnasium envs for the worker-process tests (a worker process
imports them by name to build its envs)."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CameraEnv(gym.Env):
    """A robot-sim-shaped env: a nested Dict observation with a uint8 camera
    image beside a float64 state and a Tuple of a Discrete and a Box.

    Everything is drawn from the env's own ``np_random`` (so ``reset(seed=s)``
    reproduces an episode); an episode lasts ``4 + nest[0]`` steps of the first
    observation; the reward reads the image, the state and the action.

    Args:
      crash_seed: the episode with this seed kills the process (``os._exit``)
        at its step 3: a simulator crash.
      once: a file path; with it, the crash happens only while the file does
        not exist (the crash creates it), so the episode's second run passes.
    """

    metadata = {"render_modes": []}

    def __init__(self, crash_seed: int | None = None, once: str | None = None):
        self.crash_seed, self.once = crash_seed, once
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (6, 5, 3), np.uint8),
                "state": spaces.Box(-np.inf, np.inf, (3,), np.float64),
                "nest": spaces.Tuple(
                    (spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float32))
                ),
            }
        )
        self.action_space = spaces.Box(-1, 1, (2,), np.float32)

    def _obs(self):
        r = self.np_random
        return {
            "image": r.integers(0, 256, (6, 5, 3), dtype=np.uint8),
            "state": r.normal(size=3),
            "nest": (int(r.integers(4)), r.uniform(-1, 1, 2).astype(np.float32)),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t = seed, 0
        obs = self._obs()
        self.length = 4 + obs["nest"][0]
        return obs, {}

    def step(self, action):
        self.t += 1
        if self.seed_ == self.crash_seed and self.t == 3:
            if self.once is None or not os.path.exists(self.once):
                if self.once is not None:
                    open(self.once, "w").close()
                os._exit(3)
        obs = self._obs()
        reward = float(obs["image"].mean()) / 255 + float(np.sum(action))
        reward += float(obs["state"][0])
        return obs, reward, self.t >= self.length, False, {"bright": reward}


class CountedCameraEnv(CameraEnv):
    """CameraEnv that appends its process id to the file ``made`` when built."""

    def __init__(self, made: str):
        super().__init__()
        with open(made, "a") as f:
            f.write(f"{os.getpid()}\n")


def counted_cartpole(made: str) -> gym.Env:
    """gymnasium's CartPole-v1, its process id appended to the file ``made``."""
    with open(made, "a") as f:
        f.write(f"{os.getpid()}\n")
    return gym.make("CartPole-v1")


class RaisesOnSeed(CameraEnv):
    """Raises (a Python error, the process lives) at step 2 of seed ``bad``."""

    def __init__(self, bad: int = 2):
        super().__init__()
        self.bad = bad

    def step(self, action):
        if self.seed_ == self.bad and self.t == 1:
            raise RuntimeError("the simulator broke")
        return super().step(action)


class ResetRaisesOnSeed(CameraEnv):
    """Raises (a Python error) when reset with seed ``bad``."""

    def __init__(self, bad: int = 2):
        super().__init__()
        self.bad = bad

    def reset(self, *, seed=None, options=None):
        if seed == self.bad:
            raise ValueError(f"no scene for seed {seed}")
        return super().reset(seed=seed, options=options)


class KillsItself(gym.Wrapper):
    """``gymnasium.make("CartPole-v1")`` (under its order check, as ``make``
    gives it) whose process SIGKILLs itself at the reset of seed ``seed``
    (``at="reset"``) or at step ``step`` of that seed's episode (``at="step"``):
    a simulator crash, or the OOM killer.

    Args:
      seed: the episode's seed.
      at: ``"reset"`` or ``"step"``.
      once: a file path: the kill happens only while the file does not exist
        (the kill creates it), so the episode's second run passes; None:
        every time.
      step: the step (1-based) of ``at="step"``.
    """

    def __init__(self, seed: int, at: str, once: str | None, step: int = 5):
        super().__init__(gym.make("CartPole-v1"))
        self.kill_seed, self.at, self.once, self.kill_step = seed, at, once, step
        self.seed_, self.t = None, 0

    def _kill(self) -> None:
        if self.once is None:  # every time
            os.kill(os.getpid(), signal.SIGKILL)
        if not os.path.exists(self.once):
            open(self.once, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    def reset(self, *, seed=None, options=None):
        if seed == self.kill_seed and self.at == "reset":
            self._kill()
        self.seed_, self.t = seed, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        here = (self.seed_, self.t) == (self.kill_seed, self.kill_step)
        if self.at == "step" and here:
            self._kill()
        return self.env.step(action)


class HangsOnSeed(CameraEnv):
    """Hangs (sleeps forever, in Python) at step 2 of seed ``bad``, after
    creating the file ``mark``: a simulator that stopped answering."""

    def __init__(self, bad: int = 2, mark: str | None = None):
        super().__init__()
        self.bad, self.mark = bad, mark

    def step(self, action):
        if self.seed_ == self.bad and self.t == 1:
            if self.mark is not None:
                open(self.mark, "w").close()
            while True:
                time.sleep(1)
        return super().step(action)


class CartPoleThatFails(gym.Wrapper):
    """gymnasium's CartPole that, at step 2 of seed ``seed``, hangs
    (``how="hang"``: sleeps forever, in Python) or segfaults (``how="segv"``:
    SIGSEGV to its own process, as a simulator's C code would). A hang
    creates the file named by ``$WORKER_ENVS_HANG_MARK`` first, if set."""

    def __init__(self, how: str, seed: int = 13):
        super().__init__(gym.make("CartPole-v1"))
        self.how, self.bad = how, seed
        self.seed_, self.t = None, 0

    def reset(self, *, seed=None, options=None):
        self.seed_, self.t = seed, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        if self.seed_ == self.bad and self.t == 2:
            if self.how == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if mark := os.environ.get("WORKER_ENVS_HANG_MARK"):
                open(mark, "w").close()  # says it hangs now
            while True:
                time.sleep(1)
        return self.env.step(action)


class ShiftedDiscreteEnv(gym.Env):
    """Discrete(3, start=5) actions (5, 6, 7): the reward is the action the env
    got, an episode lasts 4 steps, and an action outside the space raises."""

    metadata = {"render_modes": []}
    observation_space = spaces.Box(0, 4, (1,), np.float32)
    action_space = spaces.Discrete(3, start=5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self.t += 1
        obs = np.full(1, self.t, np.float32)
        return obs, float(action), self.t == 4, False, {}


def cartpole_that_fails(how: str, seed: int = 13) -> gym.Env:
    return CartPoleThatFails(how, seed)


# ``jaxmesh serve-env gymnasium:worker_envs:<id>`` builds these in its workers.
for _id, _how in (("HangsAtSeed13-v0", "hang"), ("SegfaultsAtSeed13-v0", "segv")):
    gym.register(_id, entry_point=cartpole_that_fails, kwargs={"how": _how})
