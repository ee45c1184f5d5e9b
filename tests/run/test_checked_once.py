"""The configuration is checked once: each check runs once per call.

A spy replaces each check function wherever jaxmesh holds it (a module's own
name for it included), then one ``evaluate`` on a JAX env, one on a gymnasium
env and one ``jaxmesh eval`` count its calls. The checks' messages are the
business of test_config.py, test_errors.py and the others.
"""

from __future__ import annotations

import collections
import importlib
import sys

import jax.numpy as jnp
import pytest

import jaxmesh
from jaxmesh.core import policy as core_policy
from jaxmesh.results import record as record_mod
from jaxmesh.run import checks, initial, instructions

#: Imported before the spies go in, so that none of them holds an unspied
#: check under its own name and no import-time default is counted.
for _name in (
    "jaxmesh.api",
    "jaxmesh.run.config",
    "jaxmesh.run.scan.evaluator",
    "jaxmesh.run.host.driver",
    "jaxmesh.cli",
    "jaxmesh.cli.build",
    "jaxmesh.cli.checks",
    "jaxmesh.cli.eval",
):
    importlib.import_module(_name)

#: (module, name) of every check counted.
CHECKS = (
    (checks, "check_metrics"),
    (checks, "check_success_mode"),
    (checks, "check_settings"),
    (checks, "check_flat"),
    (checks, "check_chunking"),
    (checks, "check_layout"),
    (checks, "settings_of"),
    (record_mod, "check_record"),
    (core_policy, "resolve_policy"),
    (initial, "resolve"),
    (instructions, "check_instruction"),
)


@pytest.fixture
def calls(monkeypatch):
    """Counts each check's calls (``trial_index_base``'s int check too)."""
    counted: collections.Counter = collections.Counter()

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            counted[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    originals = {getattr(mod, name): name for mod, name in CHECKS}
    check_int = checks.check_int

    def counted_int(name, *args, **kwargs):
        if name == "trial_index_base":
            counted["trial_index_base"] += 1
        return check_int(name, *args, **kwargs)

    originals[check_int] = None
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("jaxmesh"):
            continue
        for attr, value in list(vars(mod).items()):
            try:
                name = originals.get(value, False)
            except TypeError:  # an unhashable module attribute
                continue
            if name is None:
                monkeypatch.setattr(mod, attr, counted_int)
            elif name:
                monkeypatch.setattr(mod, attr, spy(name, value))
    return counted


def zero(obs):
    return jnp.int32(0)


def _config(**flat):
    return jaxmesh.RunConfig(
        **flat,
        num_envs=2,
        max_episode_steps=5,
        chunking=jaxmesh.Chunking(),
        layout=jaxmesh.Layout(segment_steps=64),
        starts=jaxmesh.Starts(instruction=None),
        scoring=jaxmesh.Scoring(metrics=None, success=False, success_mode="end"),
    )


EXPECTED = {
    "check_metrics": 1,
    "check_success_mode": 1,
    "check_record": 1,
    "resolve_policy": 1,
    "resolve": 1,
    "check_instruction": 1,
    "trial_index_base": 1,
    # Each group checks its own fields, RunConfig its flat knobs and what
    # they say together; the whole of check_settings runs nowhere.
    "check_chunking": 1,
    "check_layout": 1,
    "check_flat": 1,
    "settings_of": 1,
    "check_settings": 0,
}


def _once(counted, **expected):
    expected = {**EXPECTED, **expected}
    got = {name: counted[name] for name in expected}
    assert got == expected, dict(counted)


def test_jax_env_checked_once(calls):
    result = jaxmesh.evaluate(zero, "gymnax:CartPole-v1", _config(), episodes=3)
    assert result.num_episodes == 3
    _once(calls)


def test_gymnasium_env_checked_once(calls):
    pytest.importorskip("gymnasium")
    config = _config(workers=0)
    result = jaxmesh.evaluate(zero, "gymnasium:CartPole-v1", config, episodes=3)
    assert result.num_episodes == 3
    # initial states are a JAX env's: a host-stepped env refuses them
    # without resolving them.
    _once(calls, resolve=0)


def test_make_evaluator_checked_once(calls):
    config = jaxmesh.RunConfig(
        num_envs=2,
        max_episode_steps=5,
        scoring=jaxmesh.Scoring(metrics=None, success=False),
    )
    run = jaxmesh.make_evaluator(
        lambda params, obs: jnp.int32(0), "gymnax:CartPole-v1", config, episodes=3
    )
    assert run(None).returns.shape == (3,)
    assert calls["check_metrics"] == 1, dict(calls)
    assert calls["check_settings"] == 0, dict(calls)


def test_cli_eval_checked_once(calls, tmp_path):
    from jaxmesh.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(
        "env: gymnax:CartPole-v1\n"
        "policy: jaxmesh.zoo.cartpole:CartPoleMLP\n"
        "episodes: 3\nnum_envs: 2\nmax_episode_steps: 5\n"
        "success: false\nsuccess_mode: end\n"
    )
    assert main(["eval", str(config), "--no-progress"]) == 0
    # No Starts, Layout or Chunking key: the config keeps those groups'
    # defaults, checked at import.
    _once(
        calls,
        check_instruction=0,
        trial_index_base=0,
        check_layout=0,
        check_chunking=0,
    )
