"""Language instructions (``jaxmesh.adapt.Text``) against plain loops.

The policy's action depends on the encoded instruction (its first character
code's parity flips the action), so a wrong or missing instruction changes the
episodes. The references encode the string themselves and call the policy in a
plain loop over the env's own reset and step (``reference_loop.run_episode``).
"""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import ID, SEEDS, plain_loop
from reference_loop import assert_matches, gymnax_fns, run_episode, single

import jaxmesh
from jaxmesh.adapt import State, Text

WORDS = ["push left", "balance", "tip over"]  # first codes 112, 98, 116: all even
A, B = "a pole", "be still"  # 97 (odd: flipped), 98 (even)


def codes(s: str) -> np.ndarray:
    """The reference encoding: 8 character codes, zero-padded."""
    c = [ord(x) for x in s[:8]]
    return np.array(c + [0] * (8 - len(c)), np.int32)


def lean_or_flip(inp):
    """Pushes the way the pole leans; the other way when the instruction's first
    code is odd."""
    lean = (inp["obs"][2] > 0).astype(jnp.int32)
    return (lean + inp["task"][0]) % 2


class Counting:
    """``codes`` that records every string it is called with."""

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, s):
        self.calls.append(s)
        return codes(s)


def model(text: Text) -> jaxmesh.Model:
    return jaxmesh.Model(lean_or_flip, spec={"obs": State(), "task": text}, name="lf")


def reference_policy(instruction: str):
    fn = jax.jit(lean_or_flip)
    task = codes(instruction)
    return single(lambda obs, key: fn({"obs": obs, "task": task}))


# JAX env: one instruction per run ---------------------------------------------------
def test_gymnax_run_instruction_matches_plain_loop_and_does_not_recompile():
    enc = Counting()
    m = model(Text(enc))
    env, params = gymnax.make("CartPole-v1")
    reset, step = gymnax_fns(env, params)
    results = {}
    for text in (A, B):
        got = jaxmesh.evaluate(
            m,
            "gymnax:CartPole-v1",
            num_envs=3,
            seeds=SEEDS,
            starts=jaxmesh.Starts(instruction=text),
        )
        refs = [run_episode(reset, step, reference_policy(text), s) for s in SEEDS]
        assert_matches(got, refs)
        assert got.instruction == text
        results[text] = got
    assert results[B].compile_time == 0.0  # a new string is data
    assert not np.array_equal(results[A].returns, results[B].returns)
    assert enc.calls == [A, B]


def test_an_evaluator_runs_with_its_configs_instruction():
    """``Evaluator.run`` without ``instruction=`` plays the evaluator's
    config's (``Starts(instruction=)``); one given to ``run`` overrides it."""
    m = model(Text(codes))
    env, params = gymnax.make("CartPole-v1")
    reset, step = gymnax_fns(env, params)
    ev = jaxmesh.Evaluator(
        m, "gymnax:CartPole-v1", num_envs=3, starts=jaxmesh.Starts(instruction=A)
    )
    got = ev.run(seeds=SEEDS)
    assert got.instruction == A
    assert_matches(
        got, [run_episode(reset, step, reference_policy(A), s) for s in SEEDS]
    )
    other = ev.run(seeds=SEEDS, instruction=B)
    assert other.instruction == B
    assert_matches(
        other, [run_episode(reset, step, reference_policy(B), s) for s in SEEDS]
    )


def test_a_jax_env_needs_a_run_instruction(no_compile):
    m = model(Text(codes, info_key="instruction"))
    with pytest.raises(ValueError, match="JAX env.*instruction="):
        jaxmesh.evaluate(m, "gymnax:CartPole-v1", num_envs=2, episodes=2)
    with pytest.raises(ValueError, match="gets no instruction"):
        jaxmesh.evaluate(model(Text(codes)), "gymnax:CartPole-v1", episodes=2)
    with pytest.raises(TypeError, match="one string"):
        jaxmesh.evaluate(
            model(Text(codes)),
            "gymnax:CartPole-v1",
            starts=jaxmesh.Starts(instruction=3),
        )


def test_encodings_of_other_shapes_are_refused_naming_both_strings():
    text = Text(lambda s: np.zeros(len(s), np.int32))
    text.encoded("abc")
    with pytest.raises(ValueError, match=r"'abcd'.*int32\[4\].*'abc'.*int32\[3\]"):
        text.encoded("abcd")
    with pytest.raises(TypeError, match="an array .*of numbers"):
        Text(lambda s: s).encoded("x")


# Gymnasium envs: in process and served -----------------------------------------------
def test_gymnasium_run_instruction_matches_plain_loop_in_process_and_served():
    from jaxmesh.remote.server import EnvServer

    m = model(Text(codes))
    refs = plain_loop(gym.make(ID), reference_policy(A), SEEDS)
    local = jaxmesh.evaluate(
        m,
        f"gymnasium:{ID}",
        num_envs=3,
        seeds=SEEDS,
        starts=jaxmesh.Starts(instruction=A),
    )
    assert_matches(local, refs)
    with EnvServer([gym.make(ID) for _ in range(3)], "127.0.0.1:0") as server:
        far = jaxmesh.evaluate(
            m,
            f"grpc://{server.address}",
            num_envs=3,
            seeds=SEEDS,
            starts=jaxmesh.Starts(instruction=A),
        )
    assert_matches(far, refs)
    assert local.instruction == far.instruction == A


class Instructed(gym.Wrapper):
    """CartPole whose reset info names an instruction chosen by the seed."""

    metadata = {"render_modes": []}

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, "instruction": WORDS[seed % 3] if seed % 2 else A}


def instructed():
    return Instructed(gym.make(ID))


def reset_info_refs(seeds):
    """The plain loop: each episode's instruction read from its reset info."""
    env, fn, got, out = instructed(), jax.jit(lean_or_flip), {}, []

    def reset(key, seed):
        obs, info = env.reset(seed=seed)
        got["task"] = codes(info["instruction"])
        return obs, None

    def step(key, state, action):
        obs, reward, term, trunc, _ = env.step(int(action))
        return obs, None, reward, term, trunc

    policy = single(lambda obs, key: fn({"obs": obs, "task": got["task"]}))
    for seed in seeds:
        out.append(
            run_episode(lambda k, s=int(seed): reset(k, s), step, policy, int(seed))
        )
    return out


def test_per_episode_instructions_from_reset_info_match_plain_loop():
    enc = Counting()
    m = model(Text(enc, info_key="instruction"))
    seeds = SEEDS + [10, 11, 12]
    refs = reset_info_refs(seeds)
    for n in (1, 3):
        got = jaxmesh.evaluate(m, [instructed() for _ in range(n)], seeds=seeds)
        assert_matches(got, refs)
        assert got.instruction is None
    distinct = {WORDS[s % 3] if s % 2 else A for s in seeds}
    assert len(distinct) > 2
    assert sorted(enc.calls) == sorted(distinct)  # once per string, both runs
    # The run-level instruction wins over the reset info.
    flat = jaxmesh.evaluate(
        m, [instructed()], seeds=seeds, starts=jaxmesh.Starts(instruction=B)
    )
    assert_matches(flat, plain_loop(instructed(), reference_policy(B), seeds))


def test_a_reset_info_without_the_key_is_refused():
    m = model(Text(codes, info_key="goal"))
    with pytest.raises(ValueError, match=r"reset info of episode 0 .*has no such key"):
        jaxmesh.evaluate(m, [instructed()], episodes=2)


def test_served_reset_info_instructions_are_refused_before_compiling(no_compile):
    from jaxmesh.remote.server import EnvServer

    m = model(Text(codes, info_key="instruction"))
    with EnvServer([instructed()], "127.0.0.1:0") as server:
        with pytest.raises(ValueError, match="served env.*instruction="):
            jaxmesh.evaluate(m, f"grpc://{server.address}", episodes=2)


# What a run records, explain ---------------------------------------------------------
def test_result_records_the_instruction_and_resume_checks_it():
    m = model(Text(codes))
    got = jaxmesh.evaluate(
        m,
        "gymnax:CartPole-v1",
        num_envs=2,
        episodes=3,
        starts=jaxmesh.Starts(instruction=A),
    )
    back = jaxmesh.RunResult.from_dict(got.to_dict())
    assert back.instruction == A
    assert "instruction" in got.summary() and A in got.summary()
    with pytest.raises(ValueError, match="instruction"):
        jaxmesh.evaluate(
            m,
            "gymnax:CartPole-v1",
            num_envs=2,
            episodes=3,
            starts=jaxmesh.Starts(instruction=B),
            resume=back,
        )


def test_explain_shows_each_instruction_and_its_encoding():
    text = Text(codes)
    ex = jaxmesh.explain(model(text), "gymnax:CartPole-v1", instruction=A)
    assert ex.inputs["task"].kind == "Text"
    assert ex.inputs["task"].shape == (8,) and ex.inputs["task"].dtype == "int32"
    assert f"  task: instruction {A!r} -> encoded int32 (8,)" in str(ex)
    per_task = jaxmesh.explain(
        model(text), "gymnax:CartPole-v1", instruction={"push": A, "hold": B}
    )
    assert f"  task[push]: instruction {A!r}" in str(per_task)
    assert f"  task[hold]: instruction {B!r}" in str(per_task)
    fresh = Text(codes, info_key="instruction")
    ex = jaxmesh.explain(model(fresh), "gymnax:CartPole-v1")
    assert "task: from reset info key 'instruction' -> encoded at the first" in str(ex)


#: The CLI test's policy (a YAML config names it ``run.test_instructions:cli_model``).
cli_model = model(Text(codes))


def test_cli_instruction_key_reaches_the_run(tmp_path):
    import json

    import yaml

    from jaxmesh.cli import main

    out = tmp_path / "r.json"
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "env": "gymnax:CartPole-v1",
                "policy": "run.test_instructions:cli_model",
                "seeds": SEEDS[:4],
                "num_envs": 2,
                "instruction": A,
                "output": str(out),
            }
        )
    )
    assert main(["eval", str(config), "--no-progress"]) == 0
    got = jaxmesh.RunResult.from_dict(json.loads(out.read_text()))
    assert got.instruction == A
    env, params = gymnax.make("CartPole-v1")
    reset, step = gymnax_fns(env, params)
    refs = [run_episode(reset, step, reference_policy(A), s) for s in SEEDS[:4]]
    np.testing.assert_array_equal(got.returns, [r.ret for r in refs])
    bad = tmp_path / "bad.yaml"
    bad.write_text(config.read_text().replace(f"instruction: {A}", "instruction: 3"))
    assert main(["eval", str(bad), "--no-progress"]) == 2
