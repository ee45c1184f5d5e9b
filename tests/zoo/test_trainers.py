"""The zoo's trainers build their evaluators with the grouped spelling: a
trainer's validation score is the mean return of its seeds' episodes, run one
by one by the reference loop."""

from __future__ import annotations

import gymnax
import numpy as np
import pytest
from reference_loop import gymnax_fns, run_episode

from jaxmesh.zoo import cartpole

train_cartpole = pytest.importorskip("jaxmesh.zoo.train_cartpole")
REF = gymnax_fns(*gymnax.make("CartPole-v1"))


def test_the_cartpole_trainers_validation_is_the_reference_mean_return():
    cfg = train_cartpole.CartPoleESConfig(population=2, episodes=2, valid_episodes=3)
    (flat, _), _, valid_score, unravel = train_cartpole.make_trainer(cfg)
    params = unravel(flat)
    refs = [
        run_episode(*REF, lambda x, key: cartpole.apply(params, x)[None], seed).ret
        for seed in range(train_cartpole.VALID_SEEDS, train_cartpole.VALID_SEEDS + 3)
    ]
    assert float(valid_score(flat)) == pytest.approx(np.mean(refs), rel=1e-6)
