"""The run configuration: its groups check themselves when built, a grouped
field given as a flat keyword is refused naming its group and spelling, and
every entry point takes the same object."""

from __future__ import annotations

import warnings

import gymnax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_loop import assert_matches, gymnax_fns, run_episode

import jaxmesh
from jaxmesh.run import config as config_mod

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)
SEEDS = list(range(6))


def chunk8(obs):
    """A chunk of 8 actions that depends on the observation."""
    k = jnp.arange(8)
    return (obs[2] + 0.05 * k * obs[3] + 0.01 * obs[1] > 0).astype(jnp.int32)


def reference(horizon: int, lead: int) -> list:
    return [
        run_episode(*REF, lambda x, key: chunk8(x), s, horizon=horizon, lead=lead)
        for s in SEEDS
    ]


# The groups check themselves ------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error", "names"),
    [
        (lambda: jaxmesh.Chunking(prefetch_lead=-1), ValueError, "prefetch_lead=-1"),
        (lambda: jaxmesh.Chunking(delay=1, prefetch_lead=1), ValueError, "give one"),
        (lambda: jaxmesh.Chunking(delay=1, delay_ms=10.0), ValueError, "delay_ms"),
        (lambda: jaxmesh.Starts(trial_index_base=-2), ValueError, "trial_index_base"),
        (
            lambda: jaxmesh.Starts(initial_states=np.zeros(2), reset_fn=lambda k, t: k),
            ValueError,
            "pass one of them",
        ),
        (lambda: jaxmesh.Starts(randomize=3), TypeError, "randomize=3"),
        (lambda: jaxmesh.Starts(check_seeds="yes"), TypeError, "check_seeds"),
        (lambda: jaxmesh.Scoring(success_mode="often"), ValueError, "often"),
        (lambda: jaxmesh.Served(lane_groups=0), ValueError, "lane_groups"),
        (lambda: jaxmesh.Served(transport="pigeon"), ValueError, "pigeon"),
        (lambda: jaxmesh.Layout(plan_tile=0), ValueError, "plan_tile=0"),
        (lambda: jaxmesh.Layout(segment_steps=0), ValueError, "segment_steps"),
        (lambda: jaxmesh.RunConfig(num_envs=0), ValueError, "num_envs=0"),
        (lambda: jaxmesh.RunConfig(horizon=1.5), TypeError, "horizon=1.5"),
        (lambda: jaxmesh.RunConfig(workers=-1), ValueError, "workers=-1"),
        (lambda: jaxmesh.RunConfig(max_episode_seconds=0), ValueError, "seconds"),
        (lambda: jaxmesh.RunConfig(chunking=3), TypeError, "jaxmesh.Chunking"),
        (
            lambda: jaxmesh.RunConfig(
                horizon=4,
                chunking=jaxmesh.Chunking(execution=jaxmesh.Ensemble(0.1)),
            ),
            ValueError,
            "ensembling",
        ),
    ],
)
def test_a_bad_setting_is_refused_when_built(build, error, names):
    with pytest.raises(error, match=names):
        build()


def test_a_group_from_a_mapping_and_replace_by_field_name():
    config = jaxmesh.RunConfig(chunking={"prefetch_lead": 2}, horizon=4)
    assert config.chunking == jaxmesh.Chunking(prefetch_lead=2)
    moved = config.replace(prefetch_lead=1, num_envs=8, success="success")
    assert (moved.chunking.prefetch_lead, moved.num_envs) == (1, 8)
    assert moved.scoring.success == "success"
    assert config.chunking.prefetch_lead == 2  # the original is untouched
    with pytest.raises(TypeError, match="not a setting of a run"):
        config.replace(prefetch=1)


def test_the_checked_settings_are_the_configs():
    c = jaxmesh.RunConfig(
        num_envs=8,
        horizon=4,
        max_episode_steps=100,
        chunking=jaxmesh.Chunking(delay=2),
        layout=jaxmesh.Layout(plan_tile=16, segment_steps=32),
    )
    s = c.settings
    assert (s.num_envs, s.horizon, s.max_steps, s.delay) == (8, 4, 100, 2)
    assert (s.plan_tile, s.segment_steps, s.prefetch_lead) == (16, 32, 0)


def test_to_dict_never_shows_the_token():
    c = jaxmesh.RunConfig(served=jaxmesh.Served(token="s3cret"))
    assert "s3cret" not in repr(c.to_dict())
    assert c.to_dict()["token"] == "***"


# A grouped field given as a flat keyword -------------------------------------------


def never_called(obs):
    raise AssertionError("nothing runs: the keyword is refused before any compile")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: jaxmesh.evaluate(
                never_called, "gymnax:CartPole-v1", episodes=2, prefetch_lead=2
            ),
            "jaxmesh.evaluate(prefetch_lead=2): prefetch_lead is a field of "
            "chunking; write chunking=jaxmesh.Chunking(prefetch_lead=2)",
        ),
        (
            lambda: jaxmesh.evaluate(
                never_called,
                "gymnax:CartPole-v1",
                episodes=2,
                horizon=4,
                prefetch_lead=2,
                plan_tile=8,
                delay=1,
            ),
            "jaxmesh.evaluate(prefetch_lead=2, delay=1, plan_tile=8): "
            "prefetch_lead, delay are fields of chunking; plan_tile is a field of "
            "layout; write chunking=jaxmesh.Chunking(prefetch_lead=2, delay=1), "
            "layout=jaxmesh.Layout(plan_tile=8)",
        ),
        (
            lambda: jaxmesh.evaluate(
                never_called,
                "gymnax:CartPole-v1",
                episodes=2,
                chunking=jaxmesh.Chunking(delay=1),
                prefetch_lead=1,
            ),
            "jaxmesh.evaluate(prefetch_lead=1): prefetch_lead is a field of "
            "chunking; write chunking=jaxmesh.Chunking(..., prefetch_lead=1)",
        ),
        (
            lambda: jaxmesh.Evaluator(
                never_called, "gymnax:CartPole-v1", success="success"
            ),
            "jaxmesh.Evaluator(success='success'): success is a field of scoring; "
            "write scoring=jaxmesh.Scoring(success='success')",
        ),
        (
            lambda: jaxmesh.Evaluator(never_called, "gymnax:CartPole-v1", devices=1),
            "jaxmesh.Evaluator(devices=1): devices is a field of layout; "
            "write layout=jaxmesh.Layout(devices=1)",
        ),
        (
            lambda: jaxmesh.make_evaluator(
                lambda p, obs: never_called(obs),
                "gymnax:CartPole-v1",
                episodes=2,
                plan_tile=16,
            ),
            "jaxmesh.make_evaluator(plan_tile=16): plan_tile is a field of layout; "
            "write layout=jaxmesh.Layout(plan_tile=16)",
        ),
        (
            lambda: jaxmesh.sweep(
                never_called,
                "gymnax:CartPole-v1",
                horizon=[4],
                episodes=2,
                metrics=["x"],
            ),
            "jaxmesh.sweep(metrics=['x']): metrics is a field of scoring; "
            "write scoring=jaxmesh.Scoring(metrics=['x'])",
        ),
        (
            lambda: jaxmesh.evaluate(
                never_called,
                jaxmesh.Suite({"cartpole": jaxmesh.Task("gymnax:CartPole-v1")}),
                episodes=2,
                trial_index_base=3,
            ),
            "jaxmesh.evaluate(trial_index_base=3): trial_index_base is a field of "
            "starts; write starts=jaxmesh.Starts(trial_index_base=3)",
        ),
    ],
)
def test_a_grouped_field_given_flat_is_refused_naming_its_group(call, message):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not warned about
        with pytest.raises(TypeError) as caught:
            call()
    assert str(caught.value) == message


def test_an_unknown_keyword_is_refused_naming_the_settings():
    with pytest.raises(TypeError, match="horizn=: not a setting of a run"):
        jaxmesh.evaluate(never_called, "gymnax:CartPole-v1", episodes=2, horizn=4)


def test_the_grouped_spelling_runs_as_the_reference():
    refs = reference(horizon=4, lead=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the grouped spelling warns nothing
        new = jaxmesh.evaluate(
            chunk8,
            "gymnax:CartPole-v1",
            seeds=SEEDS,
            num_envs=4,
            horizon=4,
            chunking=jaxmesh.Chunking(prefetch_lead=2),
            layout=jaxmesh.Layout(plan_tile=8),
        )
    assert_matches(new, refs)
    assert (new.prefetch_lead, new.plan_tile) == (2, 8)


def test_a_config_object_with_overrides():
    refs = reference(horizon=2, lead=0)
    config = jaxmesh.RunConfig(num_envs=3, horizon=8)
    result = jaxmesh.evaluate(
        chunk8, "gymnax:CartPole-v1", config, seeds=SEEDS, horizon=2
    )
    assert (result.num_envs, result.horizon) == (3, 2)
    assert_matches(result, refs)
    assert config.horizon == 8


def test_every_entry_point_takes_the_config():
    config = jaxmesh.RunConfig(num_envs=2, horizon=4)
    refs = reference(horizon=4, lead=0)
    ev = jaxmesh.Evaluator(chunk8, "gymnax:CartPole-v1", config)
    assert_matches(ev.run(seeds=SEEDS), refs)
    pure = jaxmesh.make_evaluator(
        lambda p, obs: chunk8(obs), "gymnax:CartPole-v1", config, seeds=SEEDS
    )
    assert_matches(pure(jnp.zeros(())), refs)
    with pytest.raises(ValueError, match="does not take workers"):
        jaxmesh.make_evaluator(
            lambda p, obs: chunk8(obs), "gymnax:CartPole-v1", workers=2, episodes=2
        )
    swept = jaxmesh.sweep(
        chunk8, "gymnax:CartPole-v1", config.replace(horizon=1), horizon=[4],
        seeds=SEEDS,
    )  # fmt: skip
    assert_matches(swept.get(delay=0, horizon=4), refs)
    with pytest.raises(ValueError, match="its axes"):
        jaxmesh.sweep(chunk8, "gymnax:CartPole-v1", config, horizon=[4], episodes=2)


# Settings one backend takes, refused for the others, before anything runs -------


@pytest.mark.parametrize(
    ("env", "settings", "names"),
    [
        ("gymnax:CartPole-v1", {"workers": 2}, "drop workers="),
        ("gymnax:CartPole-v1", {"max_episode_seconds": 5.0}, "max_episode_steps"),
        ("gymnax:CartPole-v1", {"served": jaxmesh.Served(token="t")}, "token"),
        (
            "gymnasium:CartPole-v1",
            {"layout": jaxmesh.Layout(devices=1)},
            "drop devices=",
        ),
        (
            "gymnasium:CartPole-v1",
            {"starts": jaxmesh.Starts(reset_fn=lambda key, trial: None)},
            "reset_fn",
        ),
    ],
)
def test_a_setting_of_another_backend_is_refused(env, settings, names):
    def policy(obs):
        raise AssertionError("nothing runs")

    with pytest.raises((ValueError, TypeError), match=names):
        jaxmesh.evaluate(policy, env, episodes=2, **settings)


def test_the_groups_cover_every_grouped_field():
    """Each grouped field has one home, in one group."""
    old = {
        "prefetch_lead", "plan_tile", "segment_steps", "token", "lane_groups",
        "credentials", "reply_timeout", "on_server_loss", "transport", "metrics",
        "success", "devices", "check_seeds", "trial_index_base", "initial_states",
        "reset_fn", "delay", "execution", "success_mode", "instruction",
        "randomize", "delay_ms",
    }  # fmt: skip
    assert old == set(config_mod.GROUP_OF)


#: RunConfig fields a YAML file cannot hold: functions, arrays, live objects
#: (credentials come from ``tls_ca``), or settings of the Python API only.
NOT_IN_YAML = {
    "credentials",
    "initial_states",
    "reset_fn",
    "randomize",
    "devices",
    "lane_groups",
}


def test_the_command_lines_run_keys_are_the_run_configs_fields():
    """A config file's run keys are ``jaxmesh.RunConfig``'s field names: every
    key that is not the call's own (env, policy, budget, outputs) names a
    field, and every field has a key but those a YAML file cannot hold."""
    from jaxmesh.cli.config import SCHEMA

    fields = set(config_mod.FLAT) | set(config_mod.GROUP_OF)
    call = {"env", "env_config", "tasks", "suite", "policy", "policy_config", "host"}
    call |= {"episodes", "seeds", "record", "output", "tls_ca"}
    assert set(SCHEMA) - call == fields - NOT_IN_YAML
    assert NOT_IN_YAML <= fields


def test_a_config_files_keys_build_the_run_config():
    from jaxmesh.cli.build import run_config
    from jaxmesh.cli.checks import check_run_config

    config = check_run_config(
        {
            "env": "grpc://127.0.0.1:5555",
            "policy": "a:b",
            "horizon": 4,
            "delay": 1,
            "plan_tile": 16,
            "success_mode": "end",
            "reply_timeout": float("inf"),
            "instruction": "open the drawer",
        }
    )
    built = run_config(config)
    assert built.horizon == 4 and built.chunking == jaxmesh.Chunking(delay=1)
    assert built.layout.plan_tile == 16 and built.scoring.success_mode == "end"
    assert built.served.reply_timeout is None  # .inf: no limit
    assert built.starts.instruction == "open the drawer"
