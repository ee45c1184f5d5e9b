"""save_params / load_params round trips, and the shipped CartPole checkpoint."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh
from jaxmesh.zoo import cartpole


class _Net(nn.Module):
    """Float32 and bfloat16 layers plus batch-norm statistics."""

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(8)(x)
        x = nn.BatchNorm(use_running_average=True)(x)
        return nn.Dense(3, param_dtype=jnp.bfloat16)(x)


def _flax_tree():
    variables = _Net().init(jax.random.PRNGKey(3), jnp.ones((5,)))
    return {"variables": variables, "step": np.arange(4, dtype=np.int16)}


def _assert_same(restored, original):
    assert jax.tree.structure(restored) == jax.tree.structure(original)
    for got, want in zip(
        jax.tree.leaves(restored), jax.tree.leaves(original), strict=True
    ):
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_round_trip_keeps_tree_dtypes_and_values(tmp_path):
    params = _flax_tree()
    jaxmesh.save_params(tmp_path / "ck", params)
    restored = jaxmesh.load_params(tmp_path / "ck")
    _assert_same(restored, params)
    kinds = jax.tree.map(type, restored)
    assert kinds["step"] is np.ndarray  # numpy leaves stay numpy
    assert isinstance(restored["variables"]["params"]["Dense_1"]["kernel"], jax.Array)
    assert restored["variables"]["params"]["Dense_1"]["kernel"].dtype == jnp.bfloat16


def test_relative_path_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    written = jaxmesh.save_params("sub/ck", params)
    assert written == tmp_path / "sub" / "ck"
    _assert_same(jaxmesh.load_params("sub/ck"), params)


@pytest.mark.parametrize("device", [jax.devices("cpu")[0], "cpu"])
def test_device_places_every_array_leaf(tmp_path, device):
    params = _flax_tree()
    jaxmesh.save_params(tmp_path / "ck", params)
    restored = jaxmesh.load_params(tmp_path / "ck", device=device)
    cpu0 = jax.devices("cpu")[0]
    for leaf in jax.tree.leaves(restored):
        assert isinstance(leaf, jax.Array)
        assert leaf.devices() == {cpu0}
    _assert_same(restored, params)


def test_device_values_are_resolved_as_a_model_resolves_them(tmp_path):
    # One resolver: load_params and jaxmesh.Model accept and refuse the same
    # values, with the same message.
    from jaxmesh.devices import resolve_device

    jaxmesh.save_params(tmp_path / "ck", {"w": np.ones(2, np.float32)})
    cpu0 = jax.devices("cpu")[0]
    assert resolve_device("CPU:0") is cpu0 and resolve_device(None) is None
    for bad, error, match in [
        ("cpu:99", ValueError, r"has \d+ cpu device\(s\); available devices are"),
        ("cpu:x", ValueError, "the index must be an int"),
        (3, TypeError, "device=3 must be None, a jax.Device, or a string"),
    ]:
        with pytest.raises(error, match=match) as got:
            jaxmesh.load_params(tmp_path / "ck", device=bad)
        assert str(got.value).startswith("load_params: ")
        model = jaxmesh.Model(lambda obs: 0, params={"w": 1.0})
        model.device = bad
        with pytest.raises(error, match=match):
            model.placed_params()


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    with pytest.raises(FileNotFoundError, match="no_such_checkpoint") as info:
        jaxmesh.load_params(missing)
    assert "save_params" in str(info.value)


def test_directory_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not an orbax checkpoint"):
        jaxmesh.load_params(tmp_path / "plain")


def test_overwrite_needs_to_be_asked_for(tmp_path):
    path = tmp_path / "ck"
    jaxmesh.save_params(path, {"w": jnp.zeros(3)})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        jaxmesh.save_params(path, {"w": jnp.ones(3)})
    np.testing.assert_array_equal(jaxmesh.load_params(path)["w"], np.zeros(3))
    jaxmesh.save_params(path, {"v": jnp.ones(2, jnp.int32)}, overwrite=True)
    restored = jaxmesh.load_params(path)
    assert list(restored) == ["v"]
    np.testing.assert_array_equal(restored["v"], np.ones(2, np.int32))


def test_shipped_checkpoint_is_the_mlp():
    params = jaxmesh.load_params(cartpole.DEFAULT_PATH)
    fresh = cartpole.init(jax.random.PRNGKey(0))
    assert jax.tree.structure(params) == jax.tree.structure(fresh)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, fresh)


def test_shipped_policy_scores_at_least_495():
    result = jaxmesh.evaluate(
        cartpole.CartPoleMLP(), "gymnax:CartPole-v1", episodes=100, num_envs=100
    )
    assert result.num_episodes == 100
    assert result.mean_return >= 495.0
