"""jaxmesh.Model: the four corners, describe(), device placement, and the
author's path of docs/models.md (an ACT-style chunked image policy).

Every evaluation is checked against ``reference_loop.run_episode``, a plain
Python loop over gymnax's own ``reset_env`` / ``step_env``: episode i is reset
with ``PRNGKey(seeds[i])``, executes ``chunk[0..h-1]`` and re-plans.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import json

import flax.nnx as nnx
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from reference_loop import assert_matches, gymnax_fns, run_episode, single

import jaxmesh
from jaxmesh.adapt import Image, Previous, State

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)
SEEDS = [0, 5, 77]
K = 8


def lean(obs):
    """A mediocre deterministic CartPole policy: episodes of 183 to 233 steps."""
    return (obs[..., 3] > 0).astype(jnp.int32)


def chunk8(obs):
    """One lane: a chunk of 8 actions that depends on the observation."""
    k = jnp.arange(K)
    return (obs[2] + 0.05 * k * obs[3] + 0.01 * obs[1] > 0).astype(jnp.int32)


def chunk8_batch(obs):
    """A batch of lanes, written without vmap: [B, 4] -> [B, 8]."""
    k = jnp.arange(K)[None, :]
    x = obs[:, 2:3] + 0.05 * k * obs[:, 3:4] + 0.01 * obs[:, 1:2]
    return (x > 0).astype(jnp.int32)


_REFS: dict = {}


def reference(policy, *, horizon=1, key=None):
    """Reference episodes over SEEDS, computed once per ``key`` when given."""
    if key is None or (key, horizon) not in _REFS:
        policy = jax.jit(policy)
        refs = [run_episode(*REF, policy, s, horizon=horizon) for s in SEEDS]
        if key is None:
            return refs
        _REFS[(key, horizon)] = refs
    return _REFS[(key, horizon)]


# Corners trace into this counter, so a test sees which corner the engine used.
TRACED: collections.Counter = collections.Counter()


class Single(jaxmesh.Model):
    def predict(self, obs):
        TRACED["predict"] += 1
        return lean(obs)


class Batch(jaxmesh.Model):
    def predict_batch(self, obs):
        TRACED["predict_batch"] += 1
        assert obs.ndim == 2  # a batch of lanes, never one lane
        return lean(obs)


class Chunk(jaxmesh.Model):
    native_chunk = K

    def predict_chunk(self, obs):
        TRACED["predict_chunk"] += 1
        return chunk8(obs)


class ChunkBatch(jaxmesh.Model):
    native_chunk = K

    def predict_chunk_batch(self, obs):
        TRACED["predict_chunk_batch"] += 1
        return chunk8_batch(obs)


class SingleAndBatch(Single, Batch):
    """Both action corners: the engine calls the authored batched one."""


class ActionAndChunk(Single, Chunk):
    """An action corner and a chunk corner: the engine plans chunks."""


class AllFour(Single, Batch, Chunk, ChunkBatch):
    pass


CASES = [
    # (model class, horizon, reference policy, the one corner the engine traces)
    (Single, 1, single(lambda o, k: lean(o)), "predict"),
    (Batch, 1, single(lambda o, k: lean(o)), "predict_batch"),
    (Chunk, 3, lambda o, k: chunk8(o), "predict_chunk"),
    (ChunkBatch, 8, lambda o, k: chunk8(o), "predict_chunk_batch"),
    (AllFour, 5, lambda o, k: chunk8(o), "predict_chunk_batch"),
]
#: Two corners each: (model class, the one corner the engine traces). Each runs
#: the corner of a class above (that class's run, here traced alone).
COMBINED = [(SingleAndBatch, "predict_batch"), (ActionAndChunk, "predict_chunk")]
OWN = {
    Single: ("predict",),
    Batch: ("predict_batch",),
    Chunk: ("predict_chunk",),
    ChunkBatch: ("predict_chunk_batch",),
    SingleAndBatch: ("predict", "predict_batch"),
    ActionAndChunk: ("predict", "predict_chunk"),
    AllFour: jaxmesh.model.CORNERS,
}


@pytest.mark.parametrize(
    "cls, horizon, ref_policy, corner", CASES, ids=[c[0].__name__ for c in CASES]
)
def test_corners_alone_and_combined_match_reference(cls, horizon, ref_policy, corner):
    TRACED.clear()
    model = cls()
    assert model.corners() == OWN[cls]
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=2, seeds=SEEDS, horizon=horizon)
    refs = reference(
        ref_policy, horizon=horizon, key="chunk8" if cls.native_chunk else "lean"
    )
    assert_matches(result, refs)
    assert set(TRACED) == {corner}, TRACED


@pytest.mark.parametrize("cls, corner", COMBINED, ids=[c[0].__name__ for c in COMBINED])
def test_combined_corners_trace_the_one_the_engine_calls(cls, corner):
    """The engine's policy (what ``evaluate`` runs) calls one corner, fixed by
    the class: its output is that corner's, on a batch of two lanes."""
    from jaxmesh.core.policy import resolve_policy

    TRACED.clear()
    model = cls()
    assert model.corners() == OWN[cls]
    pol = resolve_policy(model, with_params=False)
    obs = jnp.array([[0.1, -0.2, 0.03, 0.5], [0.0, 0.3, -0.04, -0.6]])
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    out, _ = pol.apply(pol.default_params(), obs, keys, None)
    assert set(TRACED) == {corner}, TRACED
    want = chunk8_batch(obs) if cls.native_chunk else lean(obs)
    np.testing.assert_array_equal(out, want)


def noisy(obs, key):
    p = jax.nn.sigmoid(10.0 * obs[2] + 2.0 * obs[3])
    return jax.random.bernoulli(key, p).astype(jnp.int32)


def test_stochastic_corner_gets_the_documented_plan_key():
    class Noisy(jaxmesh.Model):
        def predict(self, obs, key):
            return noisy(obs, key)

    model = Noisy()
    assert model.stochastic
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=2, seeds=SEEDS)
    assert_matches(result, reference(single(noisy)))


def test_a_subclass_with_no_corner_is_refused():
    class Empty(jaxmesh.Model):
        native_chunk = 4

    with pytest.raises(TypeError, match="Empty implements none of the corners"):
        Empty()


def test_wrapped_function_with_params_still_works():
    w = jnp.array([0.0, 0.0, 0.0, 1.0])
    model = jaxmesh.Model(
        lambda params, obs: (obs @ params > 0).astype(jnp.int32), params=w, name="lin"
    )
    assert model.name == "lin" and model.corners() == () and not model.stochastic
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=3, seeds=SEEDS)
    # obs @ w is obs[3]: the policy `lean`.
    assert_matches(result, reference(single(lambda o, k: lean(o)), key="lean"))


# describe() -------------------------------------------------------------------
class Described(jaxmesh.Model):
    """A chunked policy with a spec and params, for describe()."""

    native_chunk = 4
    spec = {
        "image": Image(key="pixels", size=(8, 8), stack=2, dtype=jnp.bfloat16),
        "state": State(key="joints", stack=3),
        "prev": Previous(),
    }
    metadata = {"paper": "https://example.org/act", "license": "MIT"}
    temperature = jaxmesh.Param(1.0, doc="softmax temperature", low=0.0, high=10.0)
    mode = jaxmesh.Param("greedy", choices=("greedy", "sample"))
    checkpoint = jaxmesh.Param(doc="weights directory")

    def predict_chunk(self, obs, key):
        return jnp.zeros((4,), jnp.int32)


def test_describe_is_json_and_complete():
    model = Described.from_config(checkpoint="/ckpt", mode="sample")
    d = json.loads(json.dumps(model.describe()))
    assert d["schema_version"] == 1
    assert d["name"] == "Described"
    assert d["class"].endswith("test_model.Described")
    assert d["doc"] == "A chunked policy with a spec and params, for describe()."
    assert d["corners"] == ["predict_chunk"]
    assert d["native_chunk"] == 4
    assert d["stochastic"] is True and d["recurrent"] is False
    assert d["wraps"] is None and d["device"] is None
    assert d["spec"] == {
        "image": {
            "kind": "Image",
            "key": "pixels",
            "size": [8, 8],
            "stack": 2,
            "dtype": "bfloat16",
            "resize": "stretch",
            "rotate": 0,
            "crop": None,
        },
        "state": {"kind": "State", "key": "joints", "stack": 3},
        "prev": {"kind": "Previous", "stack": 1},
    }
    assert d["reads"] == ["pixels", "joints"]
    assert d["params"] == {
        "temperature": {
            "required": False,
            "doc": "softmax temperature",
            "default": 1.0,
            "type": "float",
            "low": 0.0,
            "high": 10.0,
        },
        "mode": {
            "required": False,
            "doc": "",
            "default": "greedy",
            "choices": ["greedy", "sample"],
        },
        "checkpoint": {"required": True, "doc": "weights directory"},
    }
    assert d["config"] == {"checkpoint": "/ckpt", "mode": "sample", "temperature": 1.0}
    assert d["paper"] == "https://example.org/act" and d["license"] == "MIT"


def test_describe_of_a_wrapped_function_and_metadata_clash():
    def policy(obs, key):
        return jnp.int32(0)

    d = jaxmesh.Model(policy).describe()
    assert (d["wraps"], d["name"], d["corners"], d["stochastic"]) == (
        "policy",
        "policy",
        [],
        True,
    )
    assert d["spec"] is None and d["reads"] == [None] and d["params"] == {}

    class Clash(Single):
        metadata = {"name": "other"}

    with pytest.raises(ValueError, match="metadata\\['name'\\] would replace"):
        Clash().describe()


# device -----------------------------------------------------------------------
def test_device_places_params_on_the_cpu_device():
    cpu = jax.devices("cpu")[0]
    params = {"w": np.arange(4.0, dtype=np.float32), "b": np.float32(1.0)}
    fn = lambda p, obs: (obs @ p["w"] + p["b"] > 0).astype(jnp.int32)  # noqa: E731
    for device in (cpu, "cpu", "cpu:0"):
        placed = jaxmesh.Model(fn, params=params, device=device).placed_params()
        for leaf in jax.tree.leaves(placed):
            assert isinstance(leaf, jax.Array) and leaf.devices() == {cpu}
        np.testing.assert_array_equal(placed["w"], params["w"])
    # No device: the params as they are (host numpy stays numpy).
    same = jaxmesh.Model(fn, params=params).placed_params()
    assert same is params
    with pytest.raises(ValueError, match="available devices are"):
        jaxmesh.Model(fn, params=params, device="cpu:99").placed_params()
    with pytest.raises(TypeError, match="device=3"):
        jaxmesh.Model(fn, params=params, device=3)


def test_device_attribute_on_a_subclass():
    class OnCpu(Single):
        device = "cpu"

        def load(self):
            self.params = {"w": np.ones(2, np.float32)}

    (leaf,) = jax.tree.leaves(OnCpu().placed_params())
    assert leaf.devices() == {jax.devices("cpu")[0]}


# The author's path of docs/models.md -------------------------------------------
class ActNet(nnx.Module):
    """Stacked frames + previous action -> logits of a chunk of K actions."""

    def __init__(self, *, frames, side, channels, chunk, actions, hidden, rngs):
        self.chunk, self.actions = chunk, actions
        self.conv = nnx.Conv(frames * channels, 8, (3, 3), strides=(2, 2), rngs=rngs)
        self.prev = nnx.Embed(actions, hidden, rngs=rngs)
        flat = 8 * (side // 2) * (side // 2)
        self.body = nnx.Linear(flat + hidden, hidden, rngs=rngs)
        self.head = nnx.Linear(hidden, chunk * actions, rngs=rngs)

    def __call__(self, image, prev):
        b, s, h, w, c = image.shape  # [B, frames, H, W, C], oldest frame first
        x = image.transpose(0, 2, 3, 1, 4).reshape(b, h, w, s * c)
        x = nnx.relu(self.conv(x)).reshape(b, -1)
        x = nnx.relu(self.body(jnp.concatenate([x, self.prev(prev)], axis=-1)))
        return self.head(x).reshape(b, self.chunk, self.actions)


class ACTPolicy(jaxmesh.Model):
    """ACT-style: a chunk of K actions from a stack of resized frames."""

    chunk = jaxmesh.Param(8, low=1, high=32, doc="actions per chunk (K)")
    side = jaxmesh.Param(16, choices=(16, 32), doc="image side after resizing")
    frames = jaxmesh.Param(4, low=1, high=8, doc="frames stacked")
    hidden = jaxmesh.Param(32, low=8, doc="width of the MLP")
    checkpoint = jaxmesh.Param(None, doc="orbax weights directory (None: fresh)")
    metadata = {"family": "act"}
    channels, actions = 4, 3  # Breakout-MinAtar: (10, 10, 4) frames, 3 actions

    @property
    def native_chunk(self):
        return self.chunk

    @property
    def spec(self):
        return {
            "image": Image(size=(self.side, self.side), stack=self.frames),
            "prev": Previous(),
        }

    def build(self, seed=0):
        return ActNet(
            frames=self.frames,
            side=self.side,
            channels=self.channels,
            chunk=self.chunk,
            actions=self.actions,
            hidden=self.hidden,
            rngs=nnx.Rngs(seed),
        )

    def load(self, chunk, side, frames, hidden, checkpoint):
        # The module's structure without computing anything: the weights come
        # from the checkpoint (or a fresh init when there is none).
        self.graphdef, _ = nnx.split(nnx.eval_shape(self.build))
        if checkpoint is None:
            self.params = nnx.to_pure_dict(nnx.state(self.build()))
        else:
            self.params = jaxmesh.load_params(checkpoint)

    def predict_chunk_batch(self, obs):
        net = nnx.merge(self.graphdef, self.params)
        logits = net(obs["image"], obs["prev"])
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)


CONFIG = """
env: gymnax:Breakout-MinAtar
policy: {cls}
policy_config:
  chunk: 4
  frames: 4
  side: 16
  checkpoint: {ckpt}
num_envs: 3
horizon: 4
episodes: 6
"""


def test_act_policy_from_yaml_and_orbax_matches_reference(tmp_path):
    # Weights trained elsewhere: here random numbers of the net's shapes.
    shapes = nnx.state(nnx.eval_shape(ACTPolicy.from_config(chunk=4).build))
    rng = np.random.default_rng(0)
    weights = jax.tree.map(
        lambda x: rng.normal(0.0, 0.3, x.shape).astype(np.float32),
        nnx.to_pure_dict(shapes),
    )
    jaxmesh.save_params(tmp_path / "act", weights)

    cfg = yaml.safe_load(
        CONFIG.format(cls=f"{__name__}:ACTPolicy", ckpt=tmp_path / "act")
    )
    model = jaxmesh.build_model(cfg["policy"], cfg["policy_config"])
    assert type(model) is ACTPolicy and model.native_chunk == 4

    ex = model.explain("gymnax:Breakout-MinAtar", num_envs=3)
    assert ex.leaves == [None]
    assert ex.inputs["image"].window_shape == (4, 16, 16, 4)
    assert ex.bytes_per_lane == 4 * 16 * 16 * 4 * 4 + 4  # float32 frames + int32
    assert "image" in str(ex) and "prev" in str(ex)

    env = gymnax.make("Breakout-MinAtar")
    result = jaxmesh.evaluate(
        model, env, num_envs=3, horizon=cfg["horizon"], episodes=cfg["episodes"]
    )

    # Reference: the net applied to frames resized by jax.image.resize, stacked
    # oldest first (reset frame repeated), previous executed action; rows padded
    # to the run's plan tile so that both compute in batches of one shape.
    tile = result.plan_tile
    net = nnx.merge(model.graphdef, jaxmesh.load_params(tmp_path / "act"))

    @jax.jit
    def ref_policy(frames, prev):
        image = jnp.stack(
            [jax.image.resize(f, (16, 16, 4), "bilinear") for f in frames]
        )
        image = jnp.broadcast_to(image, (tile, *image.shape))
        prev = jnp.broadcast_to(prev, (tile,))
        return jnp.argmax(net(image, prev), -1)[0].astype(jnp.int32)

    def inputs(obs_h, act_h, t):
        frames = np.stack([obs_h[max(i, 0)] for i in range(t - 3, t + 1)])
        return frames, np.int32(act_h[t - 1] if t > 0 else 0)

    fns = gymnax_fns(*env)  # jitted once for every episode
    refs = [
        run_episode(
            *fns,
            lambda x, key: ref_policy(*x),
            s,
            horizon=4,
            inputs=inputs,
        )
        for s in range(6)
    ]
    assert_matches(result, refs)
    assert len({r.length for r in refs}) > 1  # the episodes differ
    assert len(np.unique(np.concatenate([np.asarray(r.actions) for r in refs]))) == 3


# the module docstring's example ---------------------------------------------
def _docstring_example(module) -> str:
    """The code block after ``Example::`` in a module docstring, dedented."""
    import textwrap

    block = module.__doc__.split("Example::", 1)[1]
    return textwrap.dedent(block)


def test_model_docstring_example_runs_and_matches_reference():
    code = _docstring_example(jaxmesh.model)
    assert "jaxmesh.evaluate" in code  # the example evaluates, not just builds
    ns: dict = {}
    exec(compile(code, "jaxmesh/model.py:Example", "exec"), ns)

    seeds = [0, 1, 2, 3]  # episodes=4 in the example

    def chunk(obs, key):
        return jnp.full((8,), obs[2] > 0, jnp.int32)

    chunk = jax.jit(chunk)  # once for every episode
    refs = [run_episode(*REF, chunk, s, horizon=8) for s in seeds]
    assert_matches(ns["chunked"], refs)
    lean2 = jax.jit(single(lambda obs, key: (obs[2] > 0).astype(jnp.int32)))
    refs = [run_episode(*REF, lean2, s) for s in seeds]
    assert_matches(ns["result"], refs)
    assert ns["result"].policy == "lean"


# self.params: traced only inside a corner ---------------------------------------
class Weighted(jaxmesh.Model):
    """``lean`` with weights read from ``self.params``; records what it saw."""

    def load(self):
        self.params = {"w": jnp.array([0.0, 0.0, 0.0, 1.0])}
        self.seen = []

    def predict(self, obs):
        self.seen.append(type(self.params["w"]))
        return (obs @ self.params["w"] > 0).astype(jnp.int32)


def _is_concrete(tree) -> bool:
    return all(not isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def test_params_are_concrete_again_after_a_run_and_after_a_failing_one():
    model = Weighted()
    own = model.params
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=2, seeds=SEEDS)
    assert_matches(result, reference(single(lambda o, k: lean(o)), key="lean"))
    # The corner saw tracers (params are a jit argument); outside, the weights.
    assert any(issubclass(t, jax.core.Tracer) for t in model.seen)
    assert model.params is own and _is_concrete(model.params)
    assert "params" in vars(model)  # set by load: still the instance's own

    # Other params for one run: bound for that run only.
    other = {"w": jnp.array([0.0, 0.0, 0.0, -1.0])}
    jaxmesh.evaluate(model, CARTPOLE, seeds=SEEDS, params=other)
    assert model.params is own

    class Boom(Weighted):
        def predict(self, obs):
            super().predict(obs)
            raise RuntimeError("boom in predict")

    boom = Boom()
    own = boom.params
    with pytest.raises(RuntimeError, match="boom in predict"):
        jaxmesh.evaluate(boom, CARTPOLE, seeds=SEEDS)
    assert boom.seen  # it failed inside the corner, while bound
    assert boom.params is own and _is_concrete(boom.params)

    # A class-level params attribute stays a class-level one.
    class ClassParams(jaxmesh.Model):
        params = {"w": jnp.array([0.0, 0.0, 0.0, 1.0])}

        def predict(self, obs):
            raise RuntimeError("boom again")

    cls_model = ClassParams()
    with pytest.raises(RuntimeError, match="boom again"):
        jaxmesh.evaluate(cls_model, CARTPOLE, seeds=SEEDS)
    assert "params" not in vars(cls_model)
    assert cls_model.params is ClassParams.params


# the engine's view: Policy, PolicyLike, input declarations -----------------------
def test_as_policy_describes_the_model_without_the_core_knowing_it():
    from jaxmesh.core.policy import Policy, resolve_policy
    from jaxmesh.types import PolicyLike

    class Hooked(Weighted):
        device = "cpu"
        native_chunk = None

        def on_episode_end(self, episode_id):
            pass

    model = Hooked()
    assert isinstance(model, PolicyLike)
    pol = resolve_policy(model, with_params=False)
    assert isinstance(pol, Policy) and pol.name == "Hooked"
    cpu = jax.devices("cpu")[0]
    assert pol.device == cpu
    placed = pol.default_params()
    np.testing.assert_array_equal(placed["w"], [0, 0, 0, 1])
    assert placed["w"].devices() == {cpu}
    assert pol.place(np.ones(3)).devices() == {cpu}
    assert pol.on_episode_end == model.on_episode_end
    assert not pol.stochastic and pol.initial_state is None

    plain = resolve_policy(Weighted(), with_params=False)
    assert plain.device is None and plain.on_episode_end is None
    x = np.ones(3)
    assert plain.place(x) is x

    fn = resolve_policy(lean, with_params=False)
    assert fn.default_params() is None and fn.place(x) is x and fn.device is None
    with pytest.raises(TypeError, match="is not callable"):
        resolve_policy(3, with_params=False)


class Doubler:
    """Not a jaxmesh.Model: any object with ``as_policy`` is evaluated."""

    def as_policy(self, *, with_params):
        from jaxmesh.core.policy import Policy

        def apply(params, obs, keys, rstate):
            return lean(obs), rstate

        return Policy(
            name="doubler",
            apply=apply,
            stochastic=False,
            initial_state=None,
            native_chunk=None,
            spec=None,
            default_params=lambda: None,
            place=lambda tree: tree,
            device=None,
            on_episode_end=None,
        )


def test_any_policy_like_object_is_evaluated():
    result = jaxmesh.evaluate(Doubler(), CARTPOLE, num_envs=2, seeds=SEEDS)
    assert_matches(result, reference(single(lambda o, k: lean(o)), key="lean"))
    assert result.policy == "doubler"
    ex = jaxmesh.explain(Doubler(), CARTPOLE)
    assert ex.policy == "doubler" and ex.leaves == [None]


def test_input_declarations_say_what_they_read():
    from jaxmesh import adapt
    from jaxmesh.types import InputDecl

    for decl in (State(), Image(), Previous()):
        assert isinstance(decl, InputDecl)
    assert (State.reads_obs, State.reads_action) == (True, False)
    assert (Image.reads_obs, Image.reads_action) == (True, False)
    assert (Previous.reads_obs, Previous.reads_action) == (False, True)
    # Class attributes, not fields: describe() and equality ignore them.
    assert "reads_obs" not in {f.name for f in dataclasses.fields(State)}
    ex = jaxmesh.explain(None, CARTPOLE)
    assert list(ex.inputs) == [adapt.WHOLE_OBS] == ["__obs__"]


def _imports(module) -> set[str]:
    """Modules a source file imports (at any depth of its code)."""
    import ast
    import inspect

    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_layering_core_and_explain_do_not_import_the_authoring_layer():
    # import_module: `jaxmesh.explain` as an attribute is the function.
    mod = importlib.import_module
    authoring = {"jaxmesh.model", "jaxmesh.flax_models", "jaxmesh.Model"}
    for name in ("jaxmesh.core.policy", "jaxmesh.types", "jaxmesh.explain"):
        assert not _imports(mod(name)) & authoring, name
    # One device resolver, shared by Model and load_params.
    assert "jaxmesh.devices" in _imports(mod("jaxmesh.checkpoint"))
    assert "jaxmesh.devices" in _imports(mod("jaxmesh.model"))
