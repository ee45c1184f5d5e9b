"""Initial states of JAX envs (``evaluate(initial_states=...)``, ``reset_fn=``).

Episode i starts from entry ``trial_index_base + i`` of the given states (or
from ``reset_fn(PRNGKey(seeds[i]), trial_index_base + i)``), whatever lane runs
it: checked against a plain loop (``reference_loop.run_episode``) that starts
episode i from that state and steps the env's own step function.
"""

from __future__ import annotations

import dataclasses

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiles
from reference_loop import assert_matches, gymnax_fns, run_episode, single

import jaxmesh

CAP = 60  # a step cap that no episode below reaches (lengths 15..54)
T = 12  # initial states
BASE = 5  # the reset_fn runs' trial_index_base
SEEDS = [3 + 7 * i for i in range(T)]  # seeds other than 0..T-1
#: Short scan segments (the reset_fn runs): a hook hears of episodes early.
SEGMENT = 16


def policy(obs):
    """Pushes towards the side the pole leans to: episodes of 15..54 steps
    from the states below."""
    return (obs[2] > 0.0).astype(jnp.int32)


def lean(state, i):
    """A CartPole state leaning by an amount that follows ``i`` (an int or an
    int32 tracer)."""
    i = jnp.asarray(i, jnp.float32)
    return state.replace(
        theta=0.025 * (i - 6.0),
        theta_dot=0.3 * (jnp.mod(i, 4.0) - 1.5),
        x_dot=0.2 * jnp.mod(i, 3.0),
    )


@pytest.fixture(scope="module")
def cartpole():
    """(gymnax env, params, the reference's reset and step)."""
    env, params = gymnax.make("CartPole-v1")
    return env, params, *gymnax_fns(env, params)


@pytest.fixture(scope="module")
def states(cartpole):
    """T initial states, built one by one: gymnax's reset with keys of other
    seeds, then leaned; each (obs, state) with the observation recomputed
    from the changed state by the env's own ``get_obs``."""
    env, params, reset, _ = cartpole
    out = []
    for i in range(T):
        _, s = reset(jax.random.PRNGKey(1000 + i))
        s = lean(s, i)
        out.append((env.get_obs(s), s))
    return out


def reference(step, resets, seeds):
    """The plain loop: episode i from ``resets[i](key)``, key PRNGKey(seeds[i])."""
    pol = single(lambda obs, key: policy(obs))
    return [
        run_episode(reset, step, pol, seed, cap=CAP)
        for reset, seed in zip(resets, seeds, strict=True)
    ]


@pytest.fixture(scope="module")
def refs(cartpole, states):
    step = cartpole[3]
    return reference(step, [lambda key, s=s: s for s in states], SEEDS)


def test_reference_is_not_trivial(refs):
    """The states give episodes of different lengths, all ended by the env."""
    lengths = [r.length for r in refs]
    assert len(set(lengths)) > 6 and max(lengths) < CAP
    assert all(r.terminated for r in refs)


#: Lane counts: on 3 lanes each lane runs several of the 12 episodes, so an
#: entry taken from the lane (or from a count of the lane's own episodes) is
#: caught; 8 lanes start 8 episodes at once, then 4 on the first lanes free.
#: (1 lane would show nothing more: there a lane's count is the episode index.)
LANES = [3, 8]


@pytest.mark.parametrize("num_envs", LANES)
def test_initial_states_whatever_the_lanes(states, refs, num_envs):
    result = jaxmesh.evaluate(
        policy,
        "gymnax:CartPole-v1",
        num_envs=num_envs,
        seeds=SEEDS,
        max_episode_steps=CAP,
        starts=jaxmesh.Starts(initial_states=states),
    )
    assert_matches(result, refs)
    np.testing.assert_array_equal(result.seeds, SEEDS)


def test_stacked_states_and_new_values_share_a_program(states, refs):
    """The stacked form equals the list (and shares its program); other states
    of the same shapes, with a trial_index_base, compile nothing."""
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    run = lambda **kw: jaxmesh.evaluate(
        policy, "gymnax:CartPole-v1", num_envs=8, max_episode_steps=CAP, **kw
    )
    assert_matches(
        run(seeds=SEEDS, starts=jaxmesh.Starts(initial_states=stacked)), refs
    )
    # The states reversed, from entry 4 on: episode i starts from state
    # T - 1 - (4 + i).
    flipped = jax.tree.map(lambda x: x[::-1], stacked)
    with compiles() as seen:
        other = run(
            seeds=SEEDS[:8],
            starts=jaxmesh.Starts(trial_index_base=4, initial_states=flipped),
        )
    assert not seen, seen
    assert_matches(other, [refs[T - 1 - (4 + i)] for i in range(8)])
    assert other.trial_index_base == 4


def reset_fn_of(cartpole):
    env, params, _, _ = cartpole

    def reset_fn(key, trial):
        _, s = env.reset_env(key, params)  # the episode's own key
        s = lean(s, trial)
        return env.get_obs(s), s

    return reset_fn


@pytest.fixture(scope="module")
def reset_fn(cartpole):
    return reset_fn_of(cartpole)


@pytest.fixture(scope="module")
def fn_refs(cartpole, reset_fn):
    """Episode i reset by the user's function on PRNGKey(seeds[i]) and trial
    BASE + i, called outside any engine."""
    step = cartpole[3]
    resets = [lambda key, i=i: reset_fn(key, BASE + i) for i in range(len(SEEDS))]
    return reference(step, resets, SEEDS)


@pytest.mark.parametrize("num_envs", LANES)
def test_reset_fn_with_trial_index_base(reset_fn, fn_refs, num_envs):
    result = jaxmesh.evaluate(
        policy,
        "gymnax:CartPole-v1",
        num_envs=num_envs,
        seeds=SEEDS,
        max_episode_steps=CAP,
        starts=jaxmesh.Starts(reset_fn=reset_fn, trial_index_base=BASE),
        # on 3 lanes: the resumed test's first program
        layout=jaxmesh.Layout(segment_steps=SEGMENT),
    )
    assert_matches(result, fn_refs)
    assert result.trial_index_base == BASE
    assert len({r.length for r in fn_refs}) > 4  # the trial index matters


def test_an_evaluator_runs_from_its_configs_trial_index_base(reset_fn, fn_refs):
    """``Evaluator.run`` without ``trial_index_base=`` takes the evaluator's
    config's (``Starts(trial_index_base=)``), as ``success_mode`` and
    ``initial_states`` do; one given to ``run`` overrides it."""
    ev = jaxmesh.Evaluator(
        policy,
        "gymnax:CartPole-v1",
        num_envs=3,
        max_episode_steps=CAP,
        starts=jaxmesh.Starts(reset_fn=reset_fn, trial_index_base=BASE),
        layout=jaxmesh.Layout(segment_steps=SEGMENT),
    )
    result = ev.run(seeds=SEEDS)
    assert_matches(result, fn_refs)
    assert result.trial_index_base == BASE
    shifted = ev.run(seeds=SEEDS[1:], trial_index_base=BASE + 1)
    assert_matches(shifted, fn_refs[1:])


# A hand-written env: dict observations, continuous actions, noisy steps -----


@dataclasses.dataclass(eq=False)
class Drift:
    """A point in the plane moved by the action plus noise from the step key;
    reward ``-|x|^2``; ends once ``|x| < 0.2``, truncated after 25 steps."""

    name: str = "drift"
    action_shape: tuple = (2,)
    action_dtype: object = jnp.float32
    num_actions: None = None

    @staticmethod
    def _obs(state):
        return {"x": state["x"], "t": state["t"]}

    def reset(self, key):
        state = {"x": jax.random.uniform(key, (2,), minval=-1.0), "t": jnp.int32(0)}
        return self._obs(state), state

    def step(self, key, state, action):
        noise = 0.02 * jax.random.normal(key, (2,))
        x = state["x"] + 0.2 * jnp.clip(action, -1.0, 1.0) + noise
        new = {"x": x, "t": state["t"] + 1}
        term = jnp.sum(x**2) < 0.04
        return self._obs(new), new, -jnp.sum(x**2), term, new["t"] >= 25


def drift_policy(obs):
    return -0.5 * obs["x"]


def test_hand_written_env():
    env = Drift()
    starts = [np.array([1.5 - 0.4 * i, 0.5 * (i % 3)]) for i in range(6)]  # float64
    states = [({"x": x, "t": 0}, {"x": x, "t": 0}) for x in starts]
    step = jax.jit(env.step)

    def cast(tree):
        return jax.tree.map(jnp.asarray, tree)

    pol = single(lambda obs, key: drift_policy(obs))
    refs = [
        run_episode(lambda key, s=s: cast(s), step, pol, seed)
        for s, seed in zip(states, range(10, 16), strict=True)
    ]
    assert len({r.length for r in refs}) > 2
    result = jaxmesh.evaluate(
        drift_policy,
        env,
        num_envs=4,
        seeds=range(10, 16),
        starts=jaxmesh.Starts(initial_states=states),
    )
    assert_matches(result, refs, rtol=1e-5)


# Bad input, refused before anything compiles --------------------------------


def test_both_given(no_compile, states, reset_fn):
    with pytest.raises(ValueError, match="both given"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            starts=jaxmesh.Starts(initial_states=states, reset_fn=reset_fn),
        )


def test_inconsistent_leading_axes(no_compile, states):
    obs, state = jax.tree.map(lambda *xs: np.stack(xs), *states)
    ragged = (obs, state.replace(theta=state.theta[:-1]))
    with pytest.raises(ValueError, match=r"same leading axis T.*\.theta: 11"):
        jaxmesh.evaluate(
            policy, "gymnax:CartPole-v1", starts=jaxmesh.Starts(initial_states=ragged)
        )


def test_budget_larger_than_the_states(no_compile, states):
    with pytest.raises(ValueError, match="holds 12 states.*needs entry 12"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            episodes=T + 1,
            starts=jaxmesh.Starts(initial_states=states),
        )
    with pytest.raises(ValueError, match=r"entries 3\.\.12.*at most 9 episodes"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            episodes=T - 2,
            starts=jaxmesh.Starts(trial_index_base=3, initial_states=states),
        )


def test_trial_index_base_needs_initial_states(no_compile):
    with pytest.raises(ValueError, match="trial_index_base=2.*initial_states="):
        jaxmesh.evaluate(
            policy, "gymnax:CartPole-v1", starts=jaxmesh.Starts(trial_index_base=2)
        )


def test_states_not_of_the_resets_form(no_compile, states):
    obs, state = jax.tree.map(lambda *xs: np.stack(xs), *states)
    with pytest.raises(TypeError, match="structure"):
        jaxmesh.evaluate(
            policy, "gymnax:CartPole-v1", starts=jaxmesh.Starts(initial_states=state)
        )
    with pytest.raises(TypeError, match=r"leaf \[0\] is float32\[3\].*float32\[4\]"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            starts=jaxmesh.Starts(initial_states=(obs[:, :3], state)),
        )


def test_reset_fn_signature_and_output(no_compile, cartpole):
    env, params, _, _ = cartpole
    with pytest.raises(TypeError, match="two arguments"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            starts=jaxmesh.Starts(reset_fn=lambda key: env.reset_env(key)),
        )
    with pytest.raises(TypeError, match="structure"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            starts=jaxmesh.Starts(
                reset_fn=lambda key, trial: env.reset_env(key, params)[0]
            ),
        )

    def int_theta(key, trial):
        obs, s = env.reset_env(key, params)
        return obs, s.replace(theta=trial)

    with pytest.raises(TypeError, match=r"\.theta is int32\[\].*float32\[\]"):
        jaxmesh.evaluate(
            policy, "gymnax:CartPole-v1", starts=jaxmesh.Starts(reset_fn=int_theta)
        )
    with pytest.raises(TypeError, match="failed"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            starts=jaxmesh.Starts(reset_fn=lambda key, trial: trial.nope),
        )


def test_run_states_of_other_shapes(no_compile, states):
    ev = jaxmesh.Evaluator(
        policy, "gymnax:CartPole-v1", starts=jaxmesh.Starts(initial_states=states)
    )
    with pytest.raises(ValueError, match="other shapes"):
        ev.run(episodes=2, initial_states=states[:5])
    assert ev.programs() == []


def test_host_envs_refuse_initial_states(no_compile, states):
    with pytest.raises(ValueError, match="JAX envs only.*trial_index"):
        jaxmesh.evaluate(
            policy,
            "gymnasium:CartPole-v1",
            starts=jaxmesh.Starts(initial_states=states),
        )


class StopAfter:
    """A hook that ends the run once ``count`` episodes have finished."""

    def __init__(self, count):
        self.count, self.seen = count, 0

    def on_episode_end(self, ep):
        self.seen += 1
        if self.seen == self.count:
            raise KeyboardInterrupt


def test_a_resumed_run_keeps_each_episodes_trial(reset_fn, fn_refs):
    """Inside a resumed run, a missing episode gets its trial index in the
    budget (BASE + i), not its index among the missing ones."""
    kw = dict(num_envs=3, seeds=SEEDS, max_episode_steps=CAP)
    starts = jaxmesh.Starts(trial_index_base=BASE, reset_fn=reset_fn)
    with pytest.raises(KeyboardInterrupt) as e:
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            hooks=StopAfter(4),
            starts=starts,
            # the hook hears of episodes (and stops) early
            layout=jaxmesh.Layout(segment_steps=SEGMENT),
            **kw,
        )
    partial = e.value.partial_result
    assert 0 < len(partial.episodes) < T
    done = jaxmesh.evaluate(
        policy, "gymnax:CartPole-v1", resume=partial, starts=starts, **kw
    )
    assert_matches(done, fn_refs)
    with pytest.raises(ValueError, match="trial_index_base"):
        jaxmesh.evaluate(
            policy,
            "gymnax:CartPole-v1",
            resume=partial,
            starts=jaxmesh.Starts(reset_fn=reset_fn),
            **kw,
        )
