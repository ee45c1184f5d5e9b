"""Model configuration: jaxmesh.Param, from_config, ParamError, load once,
custom __init__, build_model from a YAML config."""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from reference_loop import gymnax_fns, run_episode, single

import jaxmesh
from jaxmesh import Param, ParamError

CARTPOLE = gymnax.make("CartPole-v1")
SEEDS = [3, 4]


def reference_lengths(w, seeds=SEEDS):
    """Episode lengths of the policy `obs @ w > 0` by a plain gymnax loop."""
    policy = jax.jit(single(lambda o, k: (o @ w > 0).astype(jnp.int32)))
    ref = gymnax_fns(*CARTPOLE)
    return [run_episode(*ref, policy, s).length for s in seeds]


class Linear(jaxmesh.Model):
    """A linear CartPole policy configured by params."""

    gain = Param(1.0, doc="weight of the pole velocity", low=0.0, high=10.0)
    feature = Param(3, choices=(2, 3), doc="which observation feature leads")
    label = Param(doc="a required name")
    loads = 0  # class-wide count of load calls, per test

    def load(self, gain, feature, label):
        type(self).loads += 1
        self.loaded_with = dict(gain=gain, feature=feature, label=label)
        w = np.zeros(4, np.float32)
        w[feature] = gain
        self.params = jnp.asarray(w)

    def predict(self, obs):
        return (obs @ self.params > 0).astype(jnp.int32)


# Param declarations ------------------------------------------------------------
def test_param_declaration_errors():
    with pytest.raises(ValueError, match="either choices or a low/high range"):
        Param(1, choices=(1, 2), low=0)
    with pytest.raises(ValueError, match="low exceeds high"):
        Param(1, low=2, high=1)
    with pytest.raises(ValueError, match="at least one allowed value"):
        Param(1, choices=())
    with pytest.raises(ParamError, match="default 5 is above the highest"):
        Param(5, high=4)
    with pytest.raises(ParamError, match="default 'c' is not one of the choices"):
        Param("c", choices=["a", "b"])


def test_class_attribute_is_the_declaration_instance_reads_the_value():
    assert isinstance(Linear.gain, Param) and Linear.gain.default == 1.0
    assert Linear.label.required
    model = Linear.from_config(gain=2.5, label="x")
    assert (model.gain, model.feature, model.label) == (2.5, 3, "x")
    assert model.config == {"gain": 2.5, "feature": 3, "label": "x"}
    assert list(Linear.params_schema()) == ["gain", "feature", "label"]


# from_config and ParamError --------------------------------------------------------
def test_unknown_name_names_the_param_value_and_allowed_names():
    with pytest.raises(ParamError) as e:
        Linear.from_config(gian=2.0, label="x")
    msg = str(e.value)
    assert "unknown param 'gian' (value 2.0)" in msg
    assert "['gain', 'feature', 'label']" in msg and "did you mean 'gain'" in msg
    assert (e.value.param, e.value.value) == ("gian", 2.0)
    assert isinstance(e.value, ValueError)


def test_missing_required_param():
    with pytest.raises(ParamError, match="param 'label' is required and was not"):
        Linear.from_config(gain=2.0)


@pytest.mark.parametrize(
    "config, fragment, allowed",
    [
        ({"gain": 11.0}, "value 11.0 is above the highest", "a float in [0.0, 10.0]"),
        ({"gain": -1}, "value -1 is below the lowest", "a float in [0.0, 10.0]"),
        ({"gain": "2"}, "value '2' has type str", "a float in [0.0, 10.0]"),
        ({"gain": True}, "value True has type bool", "a float in [0.0, 10.0]"),
        ({"feature": 1}, "value 1 is not one of the choices", "one of [2, 3]"),
        ({"feature": 3.5}, "value 3.5 is not one of the choices", "one of [2, 3]"),
    ],
)
def test_out_of_domain_values(config, fragment, allowed):
    with pytest.raises(ParamError) as e:
        Linear.from_config(label="x", **config)
    ((name, value),) = config.items()
    assert f"param {name!r} {fragment}" in str(e.value)
    assert f"allowed: {allowed}" in str(e.value)
    assert (e.value.param, e.value.value, e.value.allowed) == (name, value, allowed)


def test_types_are_lenient_where_yaml_is():
    class Shapes(jaxmesh.Model):
        size = Param((8, 8), doc="a tuple default accepts a YAML list")
        rate = Param(0.5, doc="a float accepts an int")
        flag = Param(False)

        def predict(self, obs):
            return jnp.int32(0)

    m = Shapes.from_config(size=[16, 16], rate=1)
    assert (m.size, m.rate, m.flag) == ([16, 16], 1, False)
    with pytest.raises(ParamError, match="'flag' value 1 has type int"):
        Shapes.from_config(flag=1)


def test_config_dict_and_keywords_merge():
    m = Linear.from_config({"gain": 2.0, "label": "a"}, label="b")
    assert m.config == {"gain": 2.0, "feature": 3, "label": "b"}
    with pytest.raises(TypeError, match="expected a dict"):
        Linear.from_config([("gain", 2.0)])


# load ---------------------------------------------------------------------------
def test_load_runs_once_before_any_predict_with_validated_values():
    Linear.loads = 0
    model = Linear.from_config(gain=2.0, feature=3, label="v")
    assert Linear.loads == 0  # building is cheap: load waits for first use
    r1 = jaxmesh.evaluate(model, CARTPOLE, num_envs=2, seeds=SEEDS)
    r2 = jaxmesh.evaluate(model, CARTPOLE, num_envs=1, seeds=SEEDS)
    model.predict(jnp.ones(4))
    model.placed_params()
    model.explain(CARTPOLE)
    assert Linear.loads == 1
    assert model.loaded_with == {"gain": 2.0, "feature": 3, "label": "v"}
    want = reference_lengths(jnp.array([0.0, 0.0, 0.0, 2.0]))
    np.testing.assert_array_equal(r1.lengths, want)
    np.testing.assert_array_equal(r2.lengths, want)


def test_describe_never_loads_and_an_unconfigured_model_says_what_to_do():
    Linear.loads = 0
    assert Linear.from_config(label="x").describe()["config"]["label"] == "x"
    assert Linear.loads == 0
    plain = Linear()  # load needs gain, feature, label: no defaults to fall back on
    with pytest.raises(ParamError, match="'label' is required and this instance"):
        _ = plain.label
    with pytest.raises(TypeError, match=r"build the model with Linear.from_config"):
        plain.predict(jnp.ones(4))
    assert Linear.loads == 0


def test_a_direct_predict_call_loads_first():
    Linear.loads = 0
    model = Linear.from_config(label="x")
    assert int(model.predict(jnp.array([0.0, 0.0, 0.0, 1.0]))) == 1
    assert Linear.loads == 1


def test_load_inside_a_trace_makes_concrete_weights():
    class Traced(jaxmesh.Model):
        def load(self):
            self.params = jnp.arange(4.0) * 2.0  # computed, not a constant

        def predict(self, obs):
            return (obs @ self.params > 0).astype(jnp.int32)

    model = Traced()
    assert int(jax.jit(model.predict)(jnp.ones(4))) == 1  # first use under jit
    assert not isinstance(model.params, jax.core.Tracer)
    np.testing.assert_array_equal(model.params, [0.0, 2.0, 4.0, 6.0])


def test_plain_constructor_uses_loads_own_defaults():
    class Defaults(jaxmesh.Model):
        width = Param(64)

        def load(self, width=7, depth=2):
            self.got = (width, depth)

        def predict(self, obs):
            return jnp.int32(0)

    plain = Defaults()
    plain.placed_params()
    assert plain.got == (7, 2)
    configured = Defaults.from_config(depth=3)  # declared default, undeclared given
    configured.placed_params()
    assert configured.got == (64, 3)
    assert list(Defaults.params_schema()) == ["width", "depth"]


def test_undeclared_load_keywords_are_params_too():
    class Implicit(jaxmesh.Model):
        def load(self, path, scale=1.0):
            self.got = (path, scale)

        def predict(self, obs):
            return jnp.int32(0)

    m = Implicit.from_config(path="/w")
    m.placed_params()
    assert m.got == ("/w", 1.0)
    with pytest.raises(ParamError, match="param 'path' is required"):
        Implicit.from_config(scale=2.0)
    with pytest.raises(ParamError, match="unknown param 'size'"):
        Implicit.from_config(path="/w", size=3)


def test_declared_param_that_load_does_not_take():
    class Mismatch(jaxmesh.Model):
        width = Param(4)

        def load(self, depth=1):
            pass

        def predict(self, obs):
            return jnp.int32(0)

    with pytest.raises(TypeError, match="load does not accept the declared param"):
        Mismatch.from_config()


def test_reserved_attribute_names_cannot_be_params():
    with pytest.raises(TypeError, match="'spec' is a jaxmesh.Model attribute"):

        class Bad(jaxmesh.Model):
            spec = Param(None)

            def predict(self, obs):
                return jnp.int32(0)


# Subclasses with their own __init__ -------------------------------------------------
def test_custom_init_without_super_still_evaluates():
    class NoSuper(jaxmesh.Model):
        def __init__(self, gain=1.0):
            self.params = jnp.array([0.0, 0.0, 0.0, gain])

        def predict(self, obs):
            return (obs @ self.params > 0).astype(jnp.int32)

    model = NoSuper(gain=3.0)
    assert model.name == "NoSuper" and model.spec is None and model.device is None
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=2, seeds=SEEDS)
    np.testing.assert_array_equal(
        result.lengths, reference_lengths(jnp.array([0.0, 0.0, 0.0, 3.0]))
    )


def test_custom_init_without_super_and_no_corner_is_refused_before_running():
    class NoCorner(jaxmesh.Model):
        def __init__(self):
            pass

    with pytest.raises(TypeError, match="NoCorner implements none of the corners"):
        NoCorner().placed_params()


def test_custom_init_with_super_and_params_visible_in_init():
    class WithSuper(jaxmesh.Model):
        width = Param(4, low=1)

        def __init__(self, name=None):
            super().__init__(name=name, native_chunk=self.width)

        def predict_chunk(self, obs):
            return jnp.zeros((self.width,), jnp.int32)

    assert WithSuper().native_chunk == 4
    m = WithSuper.from_config(width=6)
    assert m.native_chunk == 6 and m.name == "WithSuper"
    assert WithSuper(name="w").name == "w"


def test_from_config_needs_a_no_argument_constructor():
    class NeedsArg(jaxmesh.Model):
        def __init__(self, path):
            super().__init__()

        def predict(self, obs):
            return jnp.int32(0)

    with pytest.raises(TypeError, match="builds the model with no constructor"):
        NeedsArg.from_config()


def test_base_model_needs_a_function_or_a_corner():
    with pytest.raises(TypeError, match="Model implements none of the corners"):
        jaxmesh.Model()
    with pytest.raises(TypeError, match="call it on a Model subclass"):
        jaxmesh.Model.from_config()


# YAML -> build_model ------------------------------------------------------------------
CONFIG = f"""
policy:
  class: {__name__}:Linear
  config:
    gain: 4.0
    feature: 2
    label: from-yaml
"""


def test_build_model_from_yaml():
    cfg = yaml.safe_load(CONFIG)["policy"]
    model = jaxmesh.build_model(cfg["class"], cfg["config"], device="cpu")
    assert type(model) is Linear
    assert model.config == {"gain": 4.0, "feature": 2, "label": "from-yaml"}
    assert model.device == "cpu"
    bad = dict(cfg["config"], feature=7)
    with pytest.raises(ParamError, match="param 'feature' value 7"):
        jaxmesh.build_model(cfg["class"], bad)


def test_build_model_targets():
    def fn(obs):
        return jnp.int32(0)

    assert jaxmesh.build_model(fn).name == "fn"
    model = Linear.from_config(label="x")
    assert jaxmesh.build_model(model) is model
    with pytest.raises(ParamError, match="takes no config"):
        jaxmesh.build_model(fn, {"a": 1})
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod'"):
        jaxmesh.build_model("no_such_mod:X")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        jaxmesh.build_model(f"{__name__}:Nope")
    with pytest.raises(TypeError, match="expected a jaxmesh.Model subclass"):
        jaxmesh.build_model(f"{__name__}:SEEDS")
