"""The zoo's shared ES step (``jaxmesh.zoo.es``) against a NumPy
re-derivation of OpenAI-ES with antithetic pairs, centered ranks and one AdamW
step (optax's defaults: b1=0.9, b2=0.999, eps=1e-8)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

es = pytest.importorskip("jaxmesh.zoo.es")


@dataclasses.dataclass(frozen=True)
class Cfg:
    seed: int = 3
    population: int = 6
    episodes: int = 2
    sigma: float = 0.1
    learning_rate: float = 0.03
    weight_decay: float = 0.005


class Scores(NamedTuple):
    returns: jax.Array


def fitness(flat, seeds):
    # A return per episode that depends on the params and on the seed.
    return Scores(-jnp.sum((flat - 1.0) ** 2) + (seeds % 5).astype(jnp.float32))


def np_fitness(flat, seeds):
    return -np.sum((flat - 1.0) ** 2) + (seeds % 5)


def reference_step(cfg, flat, gen, train_seeds, score_centre):
    half = np.asarray(
        jax.random.normal(
            jax.random.fold_in(jax.random.PRNGKey(cfg.seed), gen),
            (cfg.population // 2, flat.size),
        ),
        np.float64,
    )
    eps = np.concatenate([half, -half])
    seeds = train_seeds + gen * cfg.episodes + np.arange(cfg.episodes)
    score = np.array(
        [np_fitness(flat + cfg.sigma * e, seeds).mean() for e in eps], np.float64
    )
    centre = np_fitness(flat, seeds).mean() if score_centre else None
    ranks = np.empty(len(score))
    ranks[np.argsort(score, kind="stable")] = np.arange(len(score))
    grad = -((ranks / (len(score) - 1) - 0.5) @ eps) / (cfg.population * cfg.sigma)
    # First AdamW step from zero moments: m / (1 - b1) = g, v / (1 - b2) = g^2.
    update = -cfg.learning_rate * (
        grad / (np.abs(grad) + 1e-8) + cfg.weight_decay * flat
    )
    return flat + update, centre, score


@pytest.mark.parametrize("score_centre", [False, True])
def test_one_generation_is_the_es_step_worked_in_numpy(score_centre):
    cfg = Cfg()
    flat = np.array([0.5, -0.25, 2.0, 0.0], np.float32)
    init_state, generation = es.make_generation(
        fitness, cfg, 1000, score_centre=score_centre
    )
    new, _, centre, score = generation(jnp.asarray(flat), init_state(flat), 4)
    want_new, want_centre, want_score = reference_step(
        cfg, flat.astype(np.float64), 4, 1000, score_centre
    )
    np.testing.assert_allclose(np.asarray(score), want_score, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(new), want_new, rtol=1e-5, atol=1e-6)
    if score_centre:
        assert float(centre) == pytest.approx(want_centre, rel=1e-6)
    else:
        assert centre is None


def test_flat_policy_refuses_an_odd_population():
    with pytest.raises(ValueError, match=r"population=5: expected an even int >= 2"):
        es.flat_policy(lambda key: {"w": jnp.zeros(2)}, None, Cfg(population=5))


def test_flat_policy_applies_the_unravelled_params():
    def init(key):
        return {"b": jnp.ones(2), "w": jnp.full((2, 2), 2.0)}

    def apply(params, obs):
        return params["w"] @ obs + params["b"]

    flat0, unravel, policy = es.flat_policy(init, apply, Cfg())
    assert flat0.shape == (6,)
    obs = jnp.array([1.0, -3.0])
    np.testing.assert_allclose(np.asarray(policy(flat0, obs)), [-3.0, -3.0])
    np.testing.assert_allclose(np.asarray(policy(flat0 * 0, obs)), [0.0, 0.0])


def scripted(centres):
    """A generation step whose centre moves +1 a generation and scores
    ``centres[gen]``; members score 0..3."""

    def generation(flat, opt_state, gen):
        return flat + 1.0, opt_state, jnp.float32(centres[int(gen)]), jnp.arange(4.0)

    return generation


def test_run_generations_keeps_the_best_offered_params_and_stops_on_patience():
    logged = []
    best, stats = es.run_generations(
        scripted([1.0, 5.0, 9.0, 9.0, 2.0, 7.0]),
        jnp.zeros(2),
        None,
        6,
        judge=lambda before, after, centre: (before, float(centre)),
        label="centre",
        stat="best_centre_return",
        log=logged.append,
        target=9.0,
        patience=2,
    )
    # Generations 2 and 3 reach the target: the run stops after 4; the last
    # best (ties kept later) is generation 3's centre, before its update: 3.
    np.testing.assert_array_equal(np.asarray(best), [3.0, 3.0])
    assert {k: v for k, v in stats.items() if k != "train_seconds"} == {
        "generations": 4,
        "best_generation": 3,
        "best_centre_return": 9.0,
    }
    assert len(logged) == 4
    assert logged[1].startswith(
        "gen    1  population mean    1.5  max    3.0  centre    5.0"
    )


def test_run_generations_without_patience_runs_them_all_and_judges_after():
    best, stats = es.run_generations(
        scripted([9.0, 9.0, 9.0]),
        jnp.zeros(1),
        None,
        3,
        judge=lambda before, after, centre: (after, -float(after[0])),
        label="valid",
        stat="best_valid_return",
        log=lambda line: None,
    )
    # Scores -1, -2, -3 of the params after each update: the first is best.
    np.testing.assert_array_equal(np.asarray(best), [1.0])
    assert stats["generations"] == 3
    assert (stats["best_generation"], stats["best_valid_return"]) == (0, -1.0)
