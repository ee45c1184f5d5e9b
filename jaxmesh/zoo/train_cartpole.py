"""Trains the CartPole MLP with evolution strategies (``jaxmesh.zoo.es``) and
saves its checkpoint. Training seeds are far from ``0..999``, the scored ones.
Deterministic from ``--seed``; it stops after ``--generations``, or once the
centre scores 500 on a validation batch ``--patience`` times in a row, keeping
the best validated centre.

Usage (needs the ``[train]`` extra, for optax)::

    python -m jaxmesh.zoo.train_cartpole [--out PATH] [--seed 0]
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import jax

import jaxmesh.zoo.es as es
from jaxmesh.zoo import cartpole

ENV = "gymnax:CartPole-v1"
MAX_RETURN = 500.0
#: Fitness seeds TRAIN_SEEDS + generation * episodes + i, validation seeds
#: VALID_SEEDS + i.
TRAIN_SEEDS = 1_000_000
VALID_SEEDS = 2_000_000


@dataclasses.dataclass(frozen=True)
class CartPoleESConfig:
    """Hyper-parameters of the ES run (the defaults produced the shipped one)."""

    seed: int = 0
    generations: int = 150
    population: int = 64  # even: population / 2 antithetic pairs
    episodes: int = 8  # fitness episodes per member per generation
    sigma: float = 0.1
    learning_rate: float = 0.03
    weight_decay: float = 0.005
    valid_episodes: int = 64
    patience: int = 5  # consecutive perfect validations before stopping


def make_trainer(cfg: CartPoleESConfig):
    """(initial state, jitted generation, validation score, unravel)."""
    state, generation, unravel, policy = es.make_trainer(
        cartpole.init, cartpole.apply, ENV, cfg, TRAIN_SEEDS, score_centre=False
    )
    validate = es.seeded_evaluator(policy, ENV, VALID_SEEDS, cfg.valid_episodes)

    @jax.jit
    def valid_score(flat):
        return validate(flat).returns.mean()

    return state, generation, valid_score, unravel


def train(cfg: CartPoleESConfig, log=print) -> tuple[Any, dict]:
    """The best centre params and stats."""
    (flat, opt_state), generation, valid_score, unravel = make_trainer(cfg)
    best_flat, stats = es.run_generations(
        generation,
        flat,
        opt_state,
        cfg.generations,
        judge=lambda before, after, centre: (after, float(valid_score(after))),
        label="centre valid",
        stat="best_valid_return",
        log=log,
        target=MAX_RETURN,
        patience=cfg.patience,
    )
    return unravel(best_flat), stats


def main(argv: list[str] | None = None) -> int:
    return es.run_cli(
        argv,
        prog="python -m jaxmesh.zoo.train_cartpole",
        doc=__doc__,
        config=CartPoleESConfig,
        train=train,
        model=cartpole.CartPoleMLP,
        env=ENV,
        eval_episodes=1000,
        eval_lanes=256,
    )


if __name__ == "__main__":
    sys.exit(main())
