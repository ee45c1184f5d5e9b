"""Trains the CartPole MLP with evolution strategies and saves its checkpoint.

OpenAI-ES (Salimans et al., 2017) on the flattened params: each generation
draws ``population / 2`` Gaussian directions and their negatives (antithetic
sampling), scores every perturbed policy with ``jaxmesh.make_evaluator`` vmapped
over the population (all inside one ``jax.jit``), turns the fitnesses into
centered ranks and takes an Adam step along the rank-weighted directions.
Fitness episodes use fresh seeds each generation, drawn from a range far from
``0..999`` (the seeds ``jaxmesh eval configs/cartpole.yaml`` scores), so the
shipped score is measured on episodes never used in training.

The run is deterministic: everything derives from ``--seed``. It stops after
``--generations``, or earlier once the centre policy scores the maximum (500) on
a held-out validation batch ``--patience`` times in a row, and keeps the centre
params with the best validation score.

Usage (needs the ``[train]`` extra, for optax)::

    python -m jaxmesh.zoo.train_cartpole [--out PATH] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import jaxmesh
from jaxmesh.checkpoint import save_params
from jaxmesh.zoo import cartpole

try:
    import optax
except ImportError as e:
    raise ImportError(
        f"the CartPole trainer needs optax ({e}), which jaxmesh installs only "
        "with its [train] extra: pip install 'jaxmesh[train]' (make train uses "
        "a venv that has it)"
    ) from e

ENV = "gymnax:CartPole-v1"
MAX_RETURN = 500.0
#: Fitness seeds are TRAIN_SEEDS + generation * episodes + i; validation seeds
#: VALID_SEEDS + i. Both are disjoint from 0..999, the evaluation seeds.
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


def centered_ranks(x: jax.Array) -> jax.Array:
    """Ranks of ``x`` mapped linearly onto [-0.5, 0.5] (ties by position)."""
    ranks = jnp.argsort(jnp.argsort(x)).astype(jnp.float32)
    return ranks / (x.shape[0] - 1) - 0.5


def make_trainer(cfg: CartPoleESConfig):
    """Builds (initial state, jitted generation step, validation function)."""
    if cfg.population < 2 or cfg.population % 2:
        raise ValueError(
            f"population={cfg.population}: expected an even int >= 2 (antithetic pairs)"
        )
    params0 = cartpole.init(jax.random.PRNGKey(cfg.seed))
    flat0, unravel = ravel_pytree(params0)

    def policy(flat: jax.Array, obs: jax.Array) -> jax.Array:
        return cartpole.apply(unravel(flat), obs)

    def evaluator(first_seed: int, episodes: int):
        # One lane and one plan row per episode: every call is a single tile.
        return jaxmesh.make_evaluator(
            policy,
            ENV,
            num_envs=episodes,
            episodes=episodes,
            seeds=range(first_seed, first_seed + episodes),
            layout=jaxmesh.Layout(plan_tile=episodes),
        )

    fitness = evaluator(TRAIN_SEEDS, cfg.episodes)
    validate = evaluator(VALID_SEEDS, cfg.valid_episodes)
    optimizer = optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay)
    key0 = jax.random.PRNGKey(cfg.seed)

    @jax.jit
    def generation(flat, opt_state, gen):
        half = jax.random.normal(
            jax.random.fold_in(key0, gen), (cfg.population // 2, flat.size)
        )
        eps = jnp.concatenate([half, -half])
        seeds = TRAIN_SEEDS + gen * cfg.episodes + jnp.arange(cfg.episodes)
        population = flat + cfg.sigma * eps
        returns = jax.vmap(fitness, in_axes=(0, None))(population, seeds).returns
        score = returns.mean(axis=1)
        # Gradient ascent on the rank-weighted directions; optax minimises.
        grad = -(centered_ranks(score) @ eps) / (cfg.population * cfg.sigma)
        updates, opt_state = optimizer.update(grad, opt_state, flat)
        return optax.apply_updates(flat, updates), opt_state, score

    @jax.jit
    def valid_score(flat):
        return validate(flat).returns.mean()

    return (flat0, optimizer.init(flat0)), generation, valid_score, unravel


def train(cfg: CartPoleESConfig, log=print) -> tuple[Any, dict]:
    """Runs ES and returns the best centre params (a flax params dict) and stats."""
    (flat, opt_state), generation, valid_score, unravel = make_trainer(cfg)
    best_flat, best_valid, best_gen, streak = flat, -np.inf, -1, 0
    t0 = time.perf_counter()
    gens_run = 0
    for gen in range(cfg.generations):
        flat, opt_state, score = generation(flat, opt_state, jnp.int32(gen))
        valid = float(valid_score(flat))
        gens_run = gen + 1
        if valid >= best_valid:
            best_flat, best_valid, best_gen = flat, valid, gen
        streak = streak + 1 if valid >= MAX_RETURN else 0
        log(
            f"gen {gen:4d}  population mean {float(score.mean()):6.1f}  max "
            f"{float(score.max()):6.1f}  centre valid {valid:6.1f}  "
            f"({time.perf_counter() - t0:6.1f} s)"
        )
        if streak >= cfg.patience:
            break
    stats = {
        "generations": gens_run,
        "best_generation": best_gen,
        "best_valid_return": best_valid,
        "train_seconds": time.perf_counter() - t0,
    }
    return unravel(best_flat), stats


def run_cli(
    argv: list[str] | None,
    *,
    prog: str,
    doc: str,
    config: type,
    train: Any,
    model: type,
    env: Any,
    eval_episodes: int,
    eval_lanes: int,
) -> int:
    """The command line of a zoo trainer: ``--out`` and one flag per field of
    the ``config`` dataclass, train, save the weights where ``model`` reads
    them, then score the saved checkpoint on ``--eval-episodes`` seeds
    ``0..N-1`` (unseen in training)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=model.DEFAULT_PATH,
        help="checkpoint directory to write (replaced if it exists); default: the "
        "checkpoint shipped in the package",
    )
    defaults = config()
    for f in dataclasses.fields(config):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(getattr(defaults, f.name)),
            default=getattr(defaults, f.name),
        )
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=eval_episodes,
        help="episodes (seeds 0..N-1, unseen in training) scored after training",
    )
    args = parser.parse_args(argv)
    cfg = config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config)})
    params, stats = train(cfg)
    out = save_params(args.out, params, overwrite=True)
    # orbax's commit marker records the absolute path written to (a machine
    # path, in a checkpoint shipped in the repository); restoring a local
    # checkpoint does not read it.
    (Path(out) / "commit_success.txt").unlink(missing_ok=True)
    print(f"trained in {stats['train_seconds']:.1f} s: {stats}")
    print(f"saved {out}")
    if args.eval_episodes:
        result = jaxmesh.evaluate(
            model.from_config(checkpoint=str(out)),
            env,
            episodes=args.eval_episodes,
            num_envs=min(eval_lanes, args.eval_episodes),
        )
        print(result.summary())
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(
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
