"""What a user passes as a policy, as the engine sees it (``jaxmesh.core.policy``).

The calling conventions of a single-lane function (``fn(obs)``, ``fn(obs, key)``,
an optional ``key=``, the params first, an ``execution_horizon`` parameter),
each checked on a batch of a few rows whose outputs are worked out by hand;
what is refused, with a message naming what was given and what to do; and how
an output's shape tells a single action from a chunk of K actions (CONTRACT 9,
11). Every apply runs eagerly on tiny arrays: nothing is jitted.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmesh.core import policy as core_policy
from jaxmesh.types import Policy

OBS = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # 3 rows (lanes)
KEYS = jax.vmap(jax.random.PRNGKey)(jnp.asarray([7, 8, 9]))


def apply(pol, params=None, obs=OBS, rstate=None, **kw):
    """The resolved policy's batched apply on ``obs`` with one key per row."""
    return pol.apply(params, obs, KEYS, rstate, **kw)


# Calling conventions -------------------------------------------------------------
def test_a_plain_function_of_the_observation():
    def double_plus_one(obs):
        return 2 * obs + 1

    pol = core_policy.resolve_policy(double_plus_one, with_params=False)
    assert pol.name == "double_plus_one"
    assert not pol.stochastic and not pol.takes_execution_horizon
    assert pol.native_chunk is None and pol.spec is None
    assert pol.default_params() is None
    out, rstate = apply(pol, rstate="kept")
    np.testing.assert_array_equal(out, [[3, 5], [7, 9], [11, 13]])
    assert rstate == "kept"  # no recurrent state: passed through as it is


def test_a_key_taken_positionally_is_each_rows_own():
    """Row i gets key i: the function returns its key, so the output is the
    keys given."""
    pol = core_policy.resolve_policy(lambda obs, key: key, with_params=False)
    assert pol.stochastic
    out, _ = apply(pol)
    np.testing.assert_array_equal(out, KEYS)


def test_an_optional_key_keyword_makes_a_policy_stochastic():
    """``fn(obs, key=None)`` gets its row's key as ``key=``."""
    pol = core_policy.resolve_policy(lambda obs, key=None: key, with_params=False)
    assert pol.stochastic
    np.testing.assert_array_equal(apply(pol)[0], KEYS)


def test_an_optional_parameter_does_not_count():
    """``lambda obs, w=10: ...`` takes one required argument: not a key."""
    pol = core_policy.resolve_policy(lambda obs, w=10.0: obs[1] * w, with_params=False)
    assert not pol.stochastic
    np.testing.assert_array_equal(apply(pol)[0], [20.0, 40.0, 60.0])


@pytest.mark.parametrize("stochastic", [False, True])
def test_params_come_first_and_are_shared_by_every_row(stochastic):
    if stochastic:
        fn = lambda params, obs, key: params["w"] * obs[0] + params["b"]  # noqa: E731
    else:
        fn = lambda params, obs: params["w"] * obs[0] + params["b"]  # noqa: E731
    pol = core_policy.resolve_policy(fn, with_params=True)
    assert pol.stochastic is stochastic
    out, _ = apply(pol, params={"w": 3.0, "b": -1.0})
    np.testing.assert_array_equal(out, [2.0, 8.0, 14.0])  # 3 * (1, 3, 5) - 1


def test_the_execution_horizon_reaches_a_policy_that_asks_for_it():
    """A chunk of ``execution_horizon`` actions, entry k = first obs + k."""

    def chunks(obs, execution_horizon=2):
        return obs[0] + jnp.arange(execution_horizon, dtype=obs.dtype)

    pol = core_policy.resolve_policy(chunks, with_params=False)
    assert pol.takes_execution_horizon and not pol.stochastic
    assert core_policy.declares_chunk(pol)
    out, _ = apply(pol, execution_horizon=3)
    np.testing.assert_array_equal(out, [[1, 2, 3], [3, 4, 5], [5, 6, 7]])


@pytest.mark.parametrize(
    ("fn", "with_params", "arity", "want"),
    [
        (lambda a, b, c: a, False, 3, "(obs) or (obs, key)"),
        (lambda: 0, False, 0, "(obs) or (obs, key)"),
        (lambda obs: obs, True, 1, "(params, obs[, key])"),
        (lambda p, o, k, x: o, True, 4, "(params, obs[, key])"),
    ],
)
def test_another_arity_is_refused_with_the_conventions(fn, with_params, arity, want):
    with pytest.raises(TypeError) as e:
        core_policy.resolve_policy(fn, with_params=with_params)
    msg = str(e.value)
    assert "'<lambda>'" in msg
    assert f"takes {arity} required positional arguments" in msg
    assert want in msg


def test_what_is_not_callable_is_refused():
    with pytest.raises(TypeError, match=r"policy 3 is not callable.*jaxmesh\.Model"):
        core_policy.resolve_policy(3, with_params=False)


def plain_policy(**fields) -> Policy:
    base = dict(
        name="p",
        apply=lambda params, obs, keys, rstate: (obs, rstate),
        stochastic=False,
        initial_state=None,
        native_chunk=None,
        spec=None,
        default_params=lambda: None,
        place=lambda x: x,
        device=None,
        on_episode_end=None,
    )
    return Policy(**{**base, **fields})


@dataclasses.dataclass
class Authored:
    """A ``PolicyLike``: an object with ``as_policy``, as ``jaxmesh.Model`` is."""

    policy: object
    asked: list = dataclasses.field(default_factory=list)

    def as_policy(self, *, with_params):
        self.asked.append(with_params)
        return self.policy


def test_an_object_with_as_policy_gives_its_own():
    params = {"w": np.asarray([1.0, 2.0], np.float32), "n": 3}
    authored = Authored(plain_policy(default_params=lambda: params))
    pol = core_policy.resolve_policy(authored, with_params=True)
    assert authored.asked == [True]
    got = pol.default_params()
    # A numpy leaf is put on the device once (the same values and dtype);
    # any other leaf is kept as it is.
    assert isinstance(got["w"], jax.Array) and got["w"].dtype == jnp.float32
    np.testing.assert_array_equal(got["w"], [1.0, 2.0])
    assert got["n"] == 3
    # With a device of its own, the policy's params are its business.
    on_device = plain_policy(default_params=lambda: params, device=jax.devices()[0])
    pol = core_policy.resolve_policy(Authored(on_device), with_params=False)
    assert pol.default_params() is params


def test_as_policy_returning_something_else_is_refused():
    with pytest.raises(TypeError, match=r"Authored\.as_policy returned a dict"):
        core_policy.resolve_policy(Authored({"apply": None}), with_params=False)


# Signatures ------------------------------------------------------------------------
def test_positional_arity():
    def kw_only(obs, *, key):
        return obs

    def var(*args):
        return args

    assert core_policy.positional_arity(lambda a, b=1: a) == 1
    assert core_policy.positional_arity(kw_only) == 1
    assert core_policy.positional_arity(var) is None
    assert core_policy.positional_arity(functools.partial(lambda p, o: o, 1)) == 1
    assert core_policy.positional_arity(lambda p, /, o: o) == 2


def test_takes_param():
    assert core_policy.takes_param(lambda obs, key=None: obs, "key")
    assert not core_policy.takes_param(lambda obs: obs, "key")
    assert not core_policy.takes_param(3, "key")  # no signature: no parameter


def test_declares_chunk():
    assert not core_policy.declares_chunk(plain_policy())
    assert core_policy.declares_chunk(plain_policy(native_chunk=4))
    assert core_policy.declares_chunk(plain_policy(declares_chunk=True))
    assert core_policy.declares_chunk(plain_policy(takes_execution_horizon=True))


# Action or chunk -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Env:
    """What ``output_chunk`` reads of an env."""

    action_shape: tuple = (2,)
    action_dtype: object = jnp.float32
    num_actions: int | None = None
    name: str = "Arm"


DISCRETE = Env(action_shape=(), action_dtype=jnp.int32, num_actions=3, name="Pick")


def out(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def chunk_of(shape, env=Env(), horizon=1, rows=3, policy=None, **kw):
    """``output_chunk`` of an output of ``shape``, any warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return core_policy.output_chunk(
            policy or plain_policy(native_chunk=None, declares_chunk=True),
            out(shape, kw.pop("dtype", jnp.float32)),
            env,
            horizon,
            rows,
            **kw,
        )


def test_a_single_action_and_a_chunk_by_shape():
    assert chunk_of((3, 2)) is None  # rows x action_shape
    assert chunk_of((3, 5, 2), horizon=4) == 5  # rows x K x action_shape
    assert chunk_of((3, 1, 2)) == 1
    assert chunk_of((3,), env=DISCRETE, dtype=jnp.int32) is None
    assert chunk_of((3, 4), env=DISCRETE, dtype=jnp.int32, horizon=4) == 4


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ((3, 3), "returned shape (3,) per lane; the env's action shape is (2,)"),
        ((3, 5, 3), "returned shape (5, 3) per lane"),
        ((3, 0, 2), "returned shape (0, 2) per lane"),
        ((3, 2, 5, 2), "return one action of shape (2,) or a chunk"),
    ],
)
def test_another_shape_is_refused_naming_both(shape, says):
    with pytest.raises(TypeError) as e:
        chunk_of(shape)
    assert says in str(e.value)


def test_a_batch_of_other_rows_is_refused():
    with pytest.raises(TypeError, match=r"shape \(4, 2\) for a batch of 3 rows"):
        chunk_of((4, 2))
    with pytest.raises(TypeError, match=r"expected \(3,\) \+ \(2,\)"):
        chunk_of(())


def test_something_else_than_one_array_is_refused():
    with pytest.raises(TypeError, match=r"returned a tuple; expected one array"):
        core_policy.output_chunk(plain_policy(), (out((3, 2)),), Env(), 1, 3)


def test_float_actions_for_a_discrete_env_are_refused():
    with pytest.raises(TypeError, match=r"discrete env with 3 actions.*argmax"):
        chunk_of((3,), env=DISCRETE, dtype=jnp.float32)


def test_a_chunk_length_other_than_the_declared_one_is_refused():
    with pytest.raises(ValueError, match="declares native_chunk=4 but .* length 5"):
        chunk_of((3, 5, 2), policy=plain_policy(native_chunk=4), horizon=4)
    with pytest.raises(ValueError, match="declares native_chunk=4 but .* length 1"):
        chunk_of((3, 2), policy=plain_policy(native_chunk=4))
    assert chunk_of((3, 4, 2), policy=plain_policy(native_chunk=4), horizon=4) == 4


def test_an_undeclared_chunk_at_horizon_1_warns_once():
    """It may be one action that forgot to index (CONTRACT 11)."""
    with pytest.warns(UserWarning) as got:
        k = core_policy.output_chunk(plain_policy(), out((3, 6, 2)), Env(), 1, 3)
    assert k == 6 and len(got) == 1
    msg = str(got[0].message)
    assert "returned shape (6, 2) per lane, read as a chunk of 6 actions" in msg
    assert "env 'Arm'" in msg and "return shape (2,)" in msg
    assert "native_chunk=6" in msg and "horizon=6" in msg
    # Asked for by the run (an ensemble, a PendingChunk): no warning.
    assert chunk_of((3, 6, 2), policy=plain_policy(), chunk_meant=True) == 6


@pytest.mark.parametrize("horizon", [2, 4])
def test_single_actions_at_a_horizon_above_1_warn_that_it_plans_every_step(horizon):
    with pytest.warns(UserWarning, match=rf"horizon={horizon} cannot replay a chunk"):
        k = core_policy.output_chunk(plain_policy(), out((3, 2)), Env(), horizon, 3)
    assert k is None


def test_the_action_space_in_words():
    assert core_policy.action_space(DISCRETE) == (
        "Discrete(3): one action is an int of shape ()"
    )
    assert core_policy.action_space(Env()) == "one action of shape (2,), float32"
