"""Trained agents no one on this project made, scored against their published returns.

The agents are the PPO policies of the public gymnax-blines repository (Apache-2.0),
converted to ``.npz`` and kept in the repository under ``tests/data/gymnax_blines``
(its README gives the source, license and conversion), with the final return each
training run logged over 164 sampled-action episodes (``logged.json``).
Reproducing those numbers through ``jaxmesh.evaluate`` checks the whole evaluator on
real networks: resets, env steps, policy keys, episode ends and the returns it
sums. A plain Python loop over gymnax's own ``reset_env`` / ``step_env`` then
checks single episodes exactly.

Pendulum-v1 is left out: its logged -200.6 does not reproduce with gymnax 1.0.1
(about -245 sampled today; see ``tests/data/gymnax_blines/README.md``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh

#: The agents and their logged returns, shipped with the tests.
AGENTS = Path(__file__).resolve().parent / "data" / "gymnax_blines"
ENVS = ("CartPole-v1", "Acrobot-v1", "Breakout-MinAtar")
#: As many episodes as each gymnax-blines run logged its final return over.
EPISODES = 164
#: Standard errors allowed between our mean and the logged one (see ``tolerance``).
Z = 4.0
#: Absolute slack: float32 sums in the logged values (CartPole logs 499.99997
#: where every episode scores 500, and a zero spread leaves no statistical room).
SLACK = 0.5

LAYERS = ("Dense_0", "Dense_1", "Dense_2")


def data_file(name: str) -> Path:
    """A file of ``tests/data/gymnax_blines``; missing is a failure, never a skip."""
    path = AGENTS / name
    assert path.is_file(), (
        f"reference data {path} is missing: it is part of the repository "
        "(tests/data/gymnax_blines); restore it from version control rather than "
        "skipping these checks"
    )
    return path


def test_reference_data_is_shipped_as_documented():
    # Every agent and the logged returns are in the repository, byte for byte
    # the files whose checksums the data README records (with their source and
    # license); a missing file fails here, it is never skipped.
    readme = data_file("README.md").read_text()
    recorded = dict(re.findall(r"`([\w.-]+\.npz)` \|[^|]*\| `([0-9a-f]{64})`", readme))
    assert sorted(recorded) == sorted(f"{name}-ppo.npz" for name in ENVS), recorded
    for file, digest in recorded.items():
        actual = hashlib.sha256(data_file(file).read_bytes()).hexdigest()
        assert actual == digest, f"{file}: sha256 {actual}, README records {digest}"
    logged = json.loads(data_file("logged.json").read_text())
    assert sorted(logged) == sorted(ENVS), sorted(logged)
    with pytest.raises(AssertionError, match="missing"):
        data_file("Pendulum-v1-ppo.npz")


def load_actor(name: str) -> dict[str, jax.Array]:
    """The categorical actor's weights of a gymnax-blines PPO agent.

    Args:
      name: the gymnax env id, e.g. ``"CartPole-v1"``.

    Returns:
      ``{"Dense_i/kernel": ..., "Dense_i/bias": ...}`` for the three actor layers;
      the critic weights in the same file are left out.
    """
    path = data_file(f"{name}-ppo.npz")
    with np.load(path) as npz:
        stored = set(npz.files)
        want = [f"{layer}/{p}" for layer in LAYERS for p in ("kernel", "bias")]
        missing = [k for k in want if k not in stored]
        if missing:
            raise KeyError(
                f"{path} lacks {missing} (it has {sorted(stored)}); expected the "
                "categorical actor Dense_0..Dense_2 of a gymnax-blines PPO agent"
            )
        return {k: jnp.asarray(npz[k]) for k in want}


def actor_logits(weights: dict[str, jax.Array], obs: jax.Array) -> jax.Array:
    """gymnax-blines' ``CategoricalSeparateMLP`` actor, one observation.

    Dense_0 -> relu -> Dense_1 -> relu -> Dense_2 (logits); MinAtar's (10, 10, 4)
    observation is flattened row-major first, as the published model does.
    """
    x = jnp.ravel(obs).astype(jnp.float32)
    for layer in LAYERS:
        x = x @ weights[f"{layer}/kernel"] + weights[f"{layer}/bias"]
        if layer != LAYERS[-1]:
            x = jax.nn.relu(x)
    return x


def agent_policy(params: dict, obs: jax.Array, key: jax.Array) -> jax.Array:
    """The agent's action: sampled from its logits, or their argmax when greedy.

    Sampling is how gymnax-blines scored its agents; ``params["greedy"]`` selects
    the deterministic agent instead.
    """
    logits = actor_logits(params["weights"], obs)
    return jnp.where(
        params["greedy"], jnp.argmax(logits), jax.random.categorical(key, logits)
    )


def agent_params(name: str, mode: str) -> dict:
    return {"weights": load_actor(name), "greedy": jnp.asarray(mode == "greedy")}


@functools.cache
def agent(name: str) -> jaxmesh.Model:
    # One model per env whose params select sampled or greedy play: the engine
    # takes params as jit arguments, so the second mode reuses the compiled run
    # (compiling dominates this file's time).
    return jaxmesh.Model(agent_policy, params=agent_params(name, "sampled"), name=name)


@functools.cache
def run(name: str, mode: str) -> jaxmesh.RunResult:
    """One 164-episode jaxmesh run (seeds 0..163), shared by the tests below."""
    model = agent(name)
    model.params = agent_params(name, mode)
    return jaxmesh.evaluate(
        model, f"gymnax:{name}", episodes=EPISODES, num_envs=EPISODES
    )


def logged_return(name: str) -> float:
    logged = json.loads(data_file("logged.json").read_text())[name]
    assert logged["num_test_rollouts"] == EPISODES, logged
    return float(logged["logged_final_return"])


def tolerance(returns: np.ndarray) -> float:
    """How far our mean may lie from the logged mean without being suspect.

    The logged value is itself the mean of 164 sampled episodes (other seeds), so
    the two means differ by noise of standard error ``sqrt(2) * SE``, SE the
    standard error of a 164-episode mean, measured from our run. ``Z = 4`` such
    errors leave a false alarm about once in 16,000 (normal approximation); the
    absolute ``SLACK`` covers float32 rounding in the logged number.
    """
    se = np.std(returns, ddof=1) / math.sqrt(len(returns))
    return Z * math.sqrt(2.0) * float(se) + SLACK


@pytest.mark.parametrize("name", ENVS)
def test_sampled_agent_reproduces_logged_return(name):
    result = run(name, "sampled")
    logged = logged_return(name)
    assert result.num_episodes == EPISODES
    assert np.array_equal(result.seeds, np.arange(EPISODES))
    tol = tolerance(result.returns)
    assert abs(result.mean_return - logged) <= tol, (
        f"{name}: sampled mean {result.mean_return:.3f} over {EPISODES} episodes, "
        f"logged {logged:.3f}, tolerance {tol:.3f}"
    )


@pytest.mark.parametrize("name", ENVS)
def test_greedy_agent_plays_at_least_as_well(name):
    # A converged PPO agent's most likely action is at least as good as a sampled
    # one: greedy must not fall below the logged (sampled) score by more than
    # the same statistical tolerance.
    result = run(name, "greedy")
    logged = logged_return(name)
    tol = tolerance(result.returns)
    assert result.mean_return >= logged - tol, (
        f"{name}: greedy mean {result.mean_return:.3f}, logged sampled "
        f"{logged:.3f}, tolerance {tol:.3f}"
    )
    if name == "CartPole-v1":
        # Balanced to the 500-step limit every time: truncated, never terminated.
        assert np.all(result.lengths == 500)
        assert np.all(result.truncated) and not np.any(result.terminated)
    else:
        # Acrobot swings up, Breakout loses its ball: every episode ends on its own.
        assert np.all(result.terminated) and not np.any(result.truncated)


def reference_episodes(
    name: str, policy: Callable, seeds: list[int]
) -> list[tuple[float, int, bool, bool]]:
    """Episodes by hand over gymnax's own functions, keys as documented.

    Episode s resets with ``PRNGKey(s)``; its step t uses the env key
    ``fold_in(fold_in(k, 0), t)`` and the policy key ``fold_in(fold_in(k, 1), t)``.
    An episode ends when the env terminates or reaches its time limit, and the
    last reward counts. Each function is jitted on its own, once, for speed.

    Returns:
      One (return, length, terminated, truncated) per seed.
    """
    env, params = gymnax.make(name)
    reset, step, act = jax.jit(env.reset_env), jax.jit(env.step_env), jax.jit(policy)
    is_truncated = jax.jit(env.is_truncated)
    stream = jax.jit(lambda k, s, t: jax.random.fold_in(jax.random.fold_in(k, s), t))
    episodes = []
    for seed in seeds:
        key = jax.random.PRNGKey(seed)
        obs, state = reset(key, params)
        total, t, done = np.float32(0.0), 0, False
        while not done:
            action = act(obs, stream(key, 1, t))
            obs, state, reward, terminated, _ = step(
                stream(key, 0, t), state, action, params
            )
            total += np.float32(reward)
            t += 1
            truncated = bool(is_truncated(state, params))
            done = bool(terminated) or truncated
        episodes.append((float(total), t, bool(terminated), truncated))
    return episodes


@pytest.mark.parametrize(
    "name, mode",
    [
        ("CartPole-v1", "greedy"),
        # Sampled actions and episodes of varied length: checks the policy keys.
        ("Acrobot-v1", "sampled"),
    ],
)
def test_episodes_equal_a_plain_python_loop(name, mode):
    result = run(name, mode)
    policy = functools.partial(agent_policy, agent_params(name, mode))
    seeds = [0, 1, 2]  # episodes 0, 1, 2 of the run (seeds default to range)
    refs = reference_episodes(name, policy, seeds)
    got = [
        (float(r), int(n), bool(te), bool(tr))
        for r, n, te, tr in zip(
            result.returns[:3],
            result.lengths[:3],
            result.terminated[:3],
            result.truncated[:3],
            strict=True,
        )
    ]
    assert list(result.seeds[:3]) == seeds
    assert got == refs, f"{name} {mode}: jaxmesh {got}, by hand {refs}"
