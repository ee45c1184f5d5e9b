"""Trains the ``CartpoleBalance`` MLP with evolution strategies
(``jaxmesh.zoo.es``, MJX inside the one ``jax.jit``) and saves its checkpoint.
Training seeds are far from ``0..999``, the scored ones; the centre is scored
with the members and the best is kept. Deterministic from ``--seed``.

Usage (needs the ``[train]`` and ``[playground]`` extras)::

    python -m jaxmesh.zoo.train_playground_cartpole [--out PATH] [--seed 0]
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import jaxmesh.zoo.es as es
from jaxmesh.envs import make_env
from jaxmesh.zoo import playground_cartpole

ENV = "playground:CartpoleBalance"
#: Fitness seeds are TRAIN_SEEDS + generation * episodes + i.
TRAIN_SEEDS = 3_000_000


@dataclasses.dataclass(frozen=True)
class CartpoleBalanceESConfig:
    """Hyper-parameters of the ES run (the defaults produced the shipped one)."""

    seed: int = 0
    generations: int = 250
    population: int = 32  # even: population / 2 antithetic pairs
    episodes: int = 4  # fitness episodes per member per generation
    episode_length: int = 500  # env steps of a fitness episode
    sigma: float = 0.1
    learning_rate: float = 0.03
    weight_decay: float = 0.005


def train(cfg: CartpoleBalanceESConfig, log=print) -> tuple[Any, dict]:
    """The best centre params and stats."""
    env = make_env(ENV, config_overrides={"episode_length": cfg.episode_length})
    (flat, opt_state), generation, unravel, _ = es.make_trainer(
        playground_cartpole.init,
        playground_cartpole.apply,
        env,
        cfg,
        TRAIN_SEEDS,
        score_centre=True,
    )
    best_flat, stats = es.run_generations(
        generation,
        flat,
        opt_state,
        cfg.generations,
        judge=lambda before, after, centre: (before, float(centre)),
        label="centre",
        stat="best_centre_return",
        log=log,
    )
    return unravel(best_flat), stats


def main(argv: list[str] | None = None) -> int:
    return es.run_cli(
        argv,
        prog="python -m jaxmesh.zoo.train_playground_cartpole",
        doc=__doc__,
        config=CartpoleBalanceESConfig,
        train=train,
        model=playground_cartpole.CartpoleMLP,
        env=ENV,
        eval_episodes=100,
        eval_lanes=100,
    )


if __name__ == "__main__":
    sys.exit(main())
