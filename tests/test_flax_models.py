"""Models from flax modules (NNX and linen), their weights saved and restored
with orbax (``jaxmesh.save_params`` / ``load_params``), evaluated on gymnax
CartPole against a plain Python loop that calls the original module."""

from __future__ import annotations

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from reference_loop import gymnax_fns, run_episode

import jaxmesh
from jaxmesh.flax_models import from_linen, from_nnx

CARTPOLE = gymnax.make("CartPole-v1")
REF = gymnax_fns(*CARTPOLE)
SEEDS = [0, 1, 2, 3]


def rows(x, tile):
    """``x`` as a batch of ``tile`` rows: the reference computes in batches of the
    size the engine used (``result.plan_tile``), so that it rounds the same."""
    return jnp.broadcast_to(x, (tile, *x.shape))


def greedy(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def reference(plan, horizon=1):
    """``plan(obs) -> chunk`` over SEEDS by gymnax's reset_env / step_env."""
    plan = jax.jit(plan)
    return [
        run_episode(*REF, lambda o, key: plan(o), s, horizon=horizon) for s in SEEDS
    ]


def assert_matches(result, refs):
    np.testing.assert_array_equal(result.returns, [r.ret for r in refs])
    np.testing.assert_array_equal(result.lengths, [r.length for r in refs])
    np.testing.assert_array_equal(result.predict_calls, [r.calls for r in refs])
    assert len({r.length for r in refs}) > 1  # the weights matter


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List(
            [nnx.Linear(4, 16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)]
        )
        self.dropout = nnx.Dropout(0.5, rngs=rngs)  # not a param: kept fixed

    def __call__(self, x):
        x = self.dropout(jnp.tanh(self.layers[0](x)))
        return self.layers[1](x)


class LinenChunker(nn.Module):
    """One observation -> logits of a chunk of 4 actions."""

    @nn.compact
    def __call__(self, obs):
        x = nn.tanh(nn.Dense(16)(obs))
        return nn.Dense(4 * 2)(x).reshape(4, 2)


def test_nnx_module_saved_restored_and_evaluated(tmp_path):
    net = NnxMLP(nnx.Rngs(3))
    net.eval()  # dropout off
    model = from_nnx(net, postprocess=greedy)
    assert model.corners() == ("predict_batch",) and model.name == "NnxMLP"
    assert set(model.params) == {"layers"} and set(model.params["layers"]) == {"0", "1"}

    jaxmesh.save_params(tmp_path / "mlp", model.params)
    restored = jaxmesh.load_params(tmp_path / "mlp")
    assert jax.tree.structure(restored) == jax.tree.structure(model.params)
    for a, b in zip(
        jax.tree.leaves(restored), jax.tree.leaves(model.params), strict=True
    ):
        np.testing.assert_array_equal(a, b)

    fresh = NnxMLP(nnx.Rngs(99))  # other weights: the restored ones replace them
    fresh.eval()
    loaded = from_nnx(fresh, params=restored, postprocess=greedy)
    result = jaxmesh.evaluate(loaded, CARTPOLE, num_envs=3, seeds=SEEDS)
    tile = result.plan_tile
    assert_matches(result, reference(lambda o: greedy(net(rows(o, tile)))[:1]))


def test_linen_chunk_module_saved_restored_and_evaluated(tmp_path):
    module = LinenChunker()
    params = module.init(jax.random.PRNGKey(4), jnp.zeros(4))
    jaxmesh.save_params(tmp_path / "chunker", params)
    restored = jaxmesh.load_params(tmp_path / "chunker", device=jax.devices("cpu")[0])

    model = from_linen(
        module, restored, native_chunk=4, batched=False, postprocess=greedy
    )
    assert model.corners() == ("predict_chunk",) and model.native_chunk == 4
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=2, seeds=SEEDS, horizon=3)

    def plan(obs):
        batch = rows(obs, result.plan_tile)
        return greedy(jax.vmap(lambda o: module.apply(params, o))(batch))[0]

    assert_matches(result, reference(plan, horizon=3))


class LinenSampler(nn.Module):
    """A batch of observations and one key -> sampled actions."""

    @nn.compact
    def __call__(self, obs, key):
        logits = nn.Dense(2)(obs)
        return jax.random.categorical(key, logits).astype(jnp.int32)


class NnxSampler(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, obs, key):
        return jax.random.categorical(key, self.linear(obs)).astype(jnp.int32)


@pytest.mark.parametrize("kind", ["linen", "nnx", "nnx-single-lane"])
def test_stochastic_module_under_evaluate_samples_with_the_plan_keys(kind):
    # The batched corner gets one key per row; each lane must sample with its
    # own plan key, as a plain loop calling the module with that key does.
    if kind == "linen":
        module = LinenSampler()
        params = module.init(
            jax.random.PRNGKey(0), jnp.zeros((1, 4)), jax.random.key(1)
        )
        model = from_linen(module, params, stochastic=True)
        sample = lambda o, key: module.apply(params, o[None], key)  # noqa: E731
    else:
        net = NnxSampler(nnx.Rngs(7))
        batched = kind == "nnx"
        model = from_nnx(net, stochastic=True, batched=batched)
        if batched:
            sample = lambda o, key: net(o[None], key)  # noqa: E731
        else:
            sample = lambda o, key: net(o, key)[None]  # noqa: E731
    assert model.stochastic
    seeds = [0, 1, 2, 3, 4, 5]
    result = jaxmesh.evaluate(model, CARTPOLE, num_envs=3, seeds=seeds)

    sample = jax.jit(sample)
    # The reference loop hands the policy the plan key of docs/evaluation.md
    # ("Keys"): fold_in(fold_in(PRNGKey(s), 1), t) at episode step t.
    refs = [run_episode(*REF, sample, s) for s in seeds]
    actions = np.concatenate([np.asarray(r.actions) for r in refs])
    assert set(np.unique(actions)) == {0, 1}  # it really samples
    assert len({r.length for r in refs}) > 1
    np.testing.assert_array_equal(result.returns, [r.ret for r in refs])
    np.testing.assert_array_equal(result.lengths, [r.length for r in refs])
    np.testing.assert_array_equal(result.predict_calls, [r.calls for r in refs])


def test_stochastic_batched_corner_takes_one_key_per_row_and_device_options():
    module = LinenSampler()
    params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)), jax.random.key(1))
    model = from_linen(module, params, stochastic=True, device="cpu", name="s")
    assert model.stochastic and model.corners() == ("predict_batch",)
    d = model.describe()
    assert (d["name"], d["stochastic"], d["device"]) == ("s", True, "cpu")
    obs = jax.random.normal(jax.random.PRNGKey(2), (5, 4))
    keys = jax.random.split(jax.random.PRNGKey(5), 5)
    want = [module.apply(params, obs[i : i + 1], keys[i])[0] for i in range(5)]
    np.testing.assert_array_equal(model.predict_batch(obs, keys), want)
    # Row i's action depends on row i alone: the same row with the same key
    # gives the same action whatever the rest of the batch is.
    other = model.predict_batch(obs[::-1], keys[::-1])[::-1]
    np.testing.assert_array_equal(other, want)
    cpu = jax.devices("cpu")[0]
    assert all(x.devices() == {cpu} for x in jax.tree.leaves(model.placed_params()))


def test_bad_modules():
    with pytest.raises(TypeError, match="expected an nnx.Module"):
        from_nnx(None)
    with pytest.raises(ValueError, match="params is None"):
        from_linen(LinenChunker(), None)


def test_both_builders_share_their_options_and_defaults():
    net = NnxMLP(nnx.Rngs(0))
    linen = LinenChunker()
    params = linen.init(jax.random.PRNGKey(0), jnp.zeros(4))
    # Defaults: batched, deterministic, named after the module's class.
    nnx_model = from_nnx(net)
    assert nnx_model.corners() == ("predict_batch",)
    assert (nnx_model.describe()["name"], nnx_model.stochastic) == ("NnxMLP", False)
    chunker = from_linen(linen, params, native_chunk=4, batched=False)
    assert chunker.corners() == ("predict_chunk",)
    assert chunker.describe()["name"] == "LinenChunker"
    # A keyword neither takes is refused in Python's words, naming the builder.
    with pytest.raises(
        TypeError, match=r"^from_nnx\(\) got an unexpected keyword argument 'chunk'$"
    ):
        from_nnx(net, chunk=4)
    with pytest.raises(
        TypeError,
        match=r"^from_linen\(\) got an unexpected keyword argument 'trainable'$",
    ):
        from_linen(linen, params, trainable=nnx.Param)
    # As Python checks keywords first, a bad keyword is named before bad values.
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk'"):
        from_nnx(None, chunk=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk'"):
        from_linen(linen, None, chunk=4)
