"""OpenAI-ES (Salimans et al., 2017) on a policy's flattened params, for the
zoo's trainers: each generation scores ``population / 2`` antithetic pairs of
Gaussian perturbations with a vmapped ``jaxmesh.make_evaluator`` (one
``jax.jit``) and takes an AdamW step along the rank-weighted directions.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import jaxmesh
from jaxmesh.checkpoint import save_params

try:
    import optax
except ImportError as e:
    raise ImportError(
        f"the CartPole trainer needs optax ({e}), which jaxmesh installs only "
        "with its [train] extra: pip install 'jaxmesh[train]' (make train uses "
        "a venv that has it)"
    ) from e


def flat_policy(init: Callable, apply: Callable, cfg: Any):
    """(flat params of ``init(PRNGKey(cfg.seed))``, unravel,
    ``policy(flat, obs)``); ValueError for an odd population."""
    if cfg.population < 2 or cfg.population % 2:
        raise ValueError(
            f"population={cfg.population}: expected an even int >= 2 (antithetic pairs)"
        )
    flat0, unravel = ravel_pytree(init(jax.random.PRNGKey(cfg.seed)))

    def policy(flat: jax.Array, obs: jax.Array) -> jax.Array:
        return apply(unravel(flat), obs)

    return flat0, unravel, policy


def seeded_evaluator(policy: Callable, env: Any, first_seed: int, episodes: int):
    """``make_evaluator`` of one lane per episode on seeds ``first_seed, ...``."""
    return jaxmesh.make_evaluator(
        policy,
        env,
        num_envs=episodes,
        episodes=episodes,
        seeds=range(first_seed, first_seed + episodes),
        layout=jaxmesh.Layout(plan_tile=episodes),
    )


def make_trainer(
    init: Callable,
    apply: Callable,
    env: Any,
    cfg: Any,
    train_seeds: int,
    *,
    score_centre: bool,
):
    """((flat0, its optimizer state), jitted generation, unravel, policy)."""
    flat0, unravel, policy = flat_policy(init, apply, cfg)
    fitness = seeded_evaluator(policy, env, train_seeds, cfg.episodes)
    init_state, generation = make_generation(
        fitness, cfg, train_seeds, score_centre=score_centre
    )
    return (flat0, init_state(flat0)), generation, unravel, policy


def make_generation(
    fitness: Callable, cfg: Any, train_seeds: int, *, score_centre: bool
):
    """(the optimizer's init, jitted ``generation(flat, opt_state, gen)`` ->
    (flat, opt_state, the centre's score before the update or None, the
    members' scores)), on seeds ``train_seeds + gen * cfg.episodes + i``."""
    optimizer = optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay)
    key0 = jax.random.PRNGKey(cfg.seed)

    @jax.jit
    def generation(flat, opt_state, gen):
        half = jax.random.normal(
            jax.random.fold_in(key0, gen), (cfg.population // 2, flat.size)
        )
        eps = jnp.concatenate([half, -half])
        seeds = train_seeds + gen * cfg.episodes + jnp.arange(cfg.episodes)
        members = flat + cfg.sigma * eps
        if score_centre:
            members = jnp.concatenate([flat[None], members])
        returns = jax.vmap(fitness, in_axes=(0, None))(members, seeds).returns
        score = returns.mean(axis=1)
        centre = None
        if score_centre:
            centre, score = score[0], score[1:]
        # Ranks onto [-0.5, 0.5] (ties by position) weigh the directions;
        # gradient ascent on them, as optax minimises.
        ranks = jnp.argsort(jnp.argsort(score)).astype(jnp.float32)
        weights = ranks / (score.shape[0] - 1) - 0.5
        grad = -(weights @ eps) / (cfg.population * cfg.sigma)
        updates, opt_state = optimizer.update(grad, opt_state, flat)
        return optax.apply_updates(flat, updates), opt_state, centre, score

    return optimizer.init, generation


def run_generations(
    generation: Callable,
    flat: jax.Array,
    opt_state: Any,
    generations: int,
    *,
    judge: Callable,
    label: str,
    stat: str,
    log: Callable,
    target: float = np.inf,
    patience: int | None = None,
) -> tuple[jax.Array, dict]:
    """Runs ES generations; returns (the best flat params, stats).
    ``judge(before, after, centre)`` gives the params offered and their score
    (``label``, ``stats[stat]``); stops after ``patience`` scores at ``target``.
    """
    best_flat, best, best_gen, streak = flat, -np.inf, -1, 0
    t0 = time.perf_counter()
    gens_run = 0
    for gen in range(generations):
        new_flat, opt_state, centre, score = generation(flat, opt_state, jnp.int32(gen))
        offered, value = judge(flat, new_flat, centre)
        flat = new_flat
        gens_run = gen + 1
        if value >= best:
            best_flat, best, best_gen = offered, value, gen
        streak = streak + 1 if value >= target else 0
        log(
            f"gen {gen:4d}  population mean {float(score.mean()):6.1f}  max "
            f"{float(score.max()):6.1f}  {label} {value:6.1f}  "
            f"({time.perf_counter() - t0:6.1f} s)"
        )
        if patience is not None and streak >= patience:
            break
    stats = {
        "generations": gens_run,
        "best_generation": best_gen,
        stat: best,
        "train_seconds": time.perf_counter() - t0,
    }
    return best_flat, stats


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
    """A zoo trainer's command line (``--out``, a flag per ``config`` field):
    train, save where ``model`` reads the weights, score the checkpoint."""
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
    # orbax's commit marker holds a machine path; restoring never reads it.
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
