"""The plain gymnasium loop the host-stepped tests compare with, and their policies.

Written from the contract, not from the engine: episode i starts with
``env.reset(seed=seeds[i])`` (and ``options={"trial_index": i}`` only for an env
that declares it, CONTRACT 6), then ``env.step`` until the env says terminated
or truncated or the cap is hit; chunk replay and prefetch follow
``reference_loop.run_episode`` (CONTRACT 10-12), and policy keys come from
``PRNGKey(seed)`` as there. Lanes follow ``reference_loop.schedule`` (CONTRACT 3).
"""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from reference_loop import assert_matches, run_episode, schedule, single

from jaxmesh.adapt import Previous, State

ID = "CartPole-v1"
#: Seeds whose episodes differ in length under the policies below.
SEEDS = [3, 1, 4, 15, 9, 2, 6]


# Policies (single-lane) ------------------------------------------------------------
def lean(obs):
    """Deterministic, one action per step: push the way the pole leans.

    A poor balancer on purpose: episodes of 25-51 steps on SEEDS.
    """
    return (obs[2] > 0).astype(jnp.int32)


def chunky(obs):
    """Deterministic chunks of 6 that wobble on purpose (episodes of ~10-60 steps)."""
    a = (obs[2] > 0).astype(jnp.int32)
    return jnp.stack([a, a, 1 - a, a, 1 - a, a])


def noisy(obs, key):
    """Stochastic, one action per step."""
    p = jax.nn.sigmoid(10 * obs[2] + 3 * obs[3])
    return jax.random.bernoulli(key, p).astype(jnp.int32)


def stacked(inp, key):
    """Stochastic chunks of 6 over a 3-frame window and the previous action."""
    frames, prev = inp["obs"], inp["prev"]
    logit = 20 * frames[-1, 2] + 5 * (frames[-1, 3] - frames[0, 3]) + 0.1 * prev
    return jax.random.bernoulli(key, jax.nn.sigmoid(logit), (6,)).astype(jnp.int32)


SPEC = {"obs": State(stack=3), "prev": Previous()}


def stacked_inputs(obs_h, act_h, t):
    """What SPEC shows at step t: the last 3 observations and the last action."""
    frames = jnp.stack([obs_h[max(i, 0)] for i in range(t - 2, t + 1)])
    prev = act_h[t - 1] if t > 0 else jnp.int32(0)
    return {"obs": frames, "prev": prev}


# The plain gymnasium loop ----------------------------------------------------------
def plain_loop(env, policy, seeds, *, horizon=1, lead=0, cap=100_000, inputs=None):
    """One episode per seed on one gymnasium env, the contract's way.

    ``policy(inputs, key) -> chunk``; see ``reference_loop.run_episode``.
    """
    declared = "trial_index" in env.metadata.get("reset_options", ())
    episodes = []
    for i, seed in enumerate(seeds):

        def reset(key, seed=int(seed), i=i):
            if declared:
                obs, _ = env.reset(seed=seed, options={"trial_index": i})
            else:
                obs, _ = env.reset(seed=seed)
            return obs, None

        def step(key, state, action):
            a = int(action) if np.ndim(action) == 0 else np.asarray(action)
            obs, reward, term, trunc, _ = env.step(a)
            return obs, None, reward, term, trunc

        episodes.append(
            run_episode(
                reset,
                step,
                policy,
                int(seed),
                horizon=horizon,
                lead=lead,
                cap=cap,
                inputs=inputs,
            )
        )
    return episodes


def per_step(fn):
    """A deterministic single-action policy as the reference's chunk of one."""
    fn = jax.jit(fn)
    return single(lambda x, key: fn(x))


def disabled_vec(n, make=lambda: gym.make(ID)):
    return SyncVectorEnv([make] * n, autoreset_mode=AutoresetMode.DISABLED)


def check(result, refs, n):
    """Every per-episode field equals the reference; lanes follow the schedule."""
    assert_matches(result, refs)
    lanes, _ = schedule([r.length for r in refs], n)
    assert result.lanes.tolist() == lanes
    assert result.env_steps == sum(r.length for r in refs)


def finished_match(partial, refs):
    """The partial result holds finished episodes only, each equal to the loop."""
    picked = [refs[i] for i in partial.indices]
    assert_matches(partial, picked)
    np.testing.assert_array_equal(partial.seeds, np.asarray(SEEDS)[partial.indices])


class TrialEnv(gym.Env):
    """A small env whose episodes reveal the reset arguments it received.

    The observation is (trial_index or -1, seed % 7, step); an episode lasts
    ``2 + seed % 3`` steps and pays ``1 + trial_index`` per step (1 without a
    trial index). Every reset is appended to ``log`` as (seed, options).
    """

    observation_space = spaces.Box(-10.0, 1e6, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, log, declares=True):
        self.log = log
        self.metadata = {"render_modes": []}
        if declares:
            self.metadata["reset_options"] = ("trial_index",)

    def _obs(self):
        return np.array([self.trial, self.seed_ % 7, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.log.append((seed, options))
        self.seed_ = -1 if seed is None else seed
        self.trial = (options or {}).get("trial_index", -1)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = 1.0 + max(self.trial, 0)
        return self._obs(), reward, self.t >= 2 + self.seed_ % 3, False, {}


def trial_policy(obs):
    return (obs[0] > 2).astype(jnp.int32)


class BreaksOnSeed(gym.Wrapper):
    """CartPole whose step raises at step 5 of the episode with seed ``bad``."""

    def __init__(self, bad):
        super().__init__(gym.make(ID))
        self.bad = bad

    def reset(self, *, seed=None, options=None):
        self.seed_, self.t = seed, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self.seed_ == self.bad and self.t == 5:
            raise RuntimeError("the simulator broke")
        self.t += 1
        return self.env.step(action)


def tilt_episodes(seeds) -> list[tuple[float, int]]:
    """Returns and lengths of ``cli_policies:tilt`` in a plain gymnasium loop.

    Episode i starts with ``env.reset(seed=seeds[i])``; the action pushes the
    way the pole leans (``tilt_fn`` in numpy); the episode runs until gymnasium
    says terminated or truncated, the last reward counted.
    """
    env = gym.make(ID)
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        total, length, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(obs[2] > 0))
            total += float(reward)
            length += 1
            done = terminated or truncated
        out.append((total, length))
    env.close()
    return out


def start_serve_envs(*arg_lists):
    """``jaxmesh serve-env`` child processes, started together: ``[(process,
    address), ...]`` once each is ready (readiness comes through
    ``--ready-fd``)."""
    started = []
    for args in arg_lists:
        r, w = os.pipe()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jaxmesh.cli",
                "serve-env",
                *args,
                "--ready-fd",
                str(w),
            ],
            pass_fds=(w,),
            stdout=subprocess.DEVNULL,
        )
        os.close(w)
        started.append((proc, r))
    out = []
    for proc, r in started:
        with os.fdopen(r) as ready:
            address = ready.readline().strip()
        assert address, f"serve-env exited with {proc.wait()}"
        out.append((proc, address))
    return out


def start_serve_env(*args):
    """One ``jaxmesh serve-env`` child process: ``(process, address)``."""
    return start_serve_envs(args)[0]
