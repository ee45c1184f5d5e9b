"""Playground's Menagerie envs (locomotion, manipulation): where their robot
files come from, the error when there are none, and an evaluation of
``Go1JoystickFlatTerrain`` against a plain loop over Playground's own
``env.reset`` / ``env.step``.

No Menagerie checkout can be fetched here (no network), and no package ships
one, so the Go1 run uses a Menagerie-shaped folder made by the test: Go1 takes
only five meshes from Menagerie (``unitree_go1/assets/*.stl``); the rest of
the robot is Playground's own XML. Those meshes are drawn only (the ``visual``
class: no contacts) and every body states its inertia, so tetrahedra in their
place leave the physics as it is (checked below: the compiled masses and
inertias do not depend on the meshes).

MJX compiles Go1 slowly on a CPU (about a minute per program), so the file
compiles two programs, each once, in module fixtures: the reference (every
seed's episode, vmapped, in one jit) and the jaxmesh run.
"""

from __future__ import annotations

import struct
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco_playground")

import jaxmesh  # noqa: E402
from jaxmesh.envs import make_env, playground  # noqa: E402

ENV = "Go1JoystickFlatTerrain"
LENGTH = 20
SEEDS = [0, 1, 2]
#: Go1's meshes, the only files it reads from Menagerie.
GO1_MESHES = ["trunk", "hip", "thigh", "thigh_mirror", "calf"]
#: Reward terms that are smooth in the state: compared closely. The others
#: (feet contact, air time) flip with the last bit of a foot's height, and
#: XLA rounds the vmapped physics differently for another number of lanes.
SMOOTH = ["reward/tracking_lin_vel", "reward/tracking_ang_vel", "reward/pose"]


def policy(obs):
    return jnp.zeros(12)  # hold the default pose (Go1's actions are offsets)


def _tetrahedron(size: float) -> bytes:
    """A binary STL of one tetrahedron of edge ``size``."""
    v = np.array([[0, 0, 0], [size, 0, 0], [0, size, 0], [0, 0, size]], np.float32)
    faces = [(0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3)]
    out = bytearray(80) + struct.pack("<I", len(faces))
    for f in faces:
        p = v[list(f)]
        n = np.cross(p[1] - p[0], p[2] - p[0])
        out += struct.pack("<12fH", *(n / np.linalg.norm(n)), *p.ravel(), 0)
    return bytes(out)


def stand_in(root, size: float = 0.05):
    """A Menagerie-shaped folder with Go1's meshes as tetrahedra."""
    assets = root / "unitree_go1" / "assets"
    assets.mkdir(parents=True)
    for name in GO1_MESHES:
        (assets / f"{name}.stl").write_bytes(_tetrahedron(size))
    return root


@pytest.fixture(scope="module")
def menagerie(tmp_path_factory):
    return stand_in(tmp_path_factory.mktemp("menagerie"))


@pytest.fixture(scope="module")
def env(menagerie):
    return make_env(
        f"playground:{ENV}",
        menagerie=menagerie,
        config_overrides={"episode_length": LENGTH},
    )


@pytest.fixture
def no_menagerie(tmp_path, monkeypatch):
    """Playground's own copy absent and its git clone failing (as offline),
    in a folder of the test's own (nothing written into Playground)."""
    from mujoco_playground._src import mjx_env

    def offline(url, target, commit):
        raise subprocess.CalledProcessError(128, ["git", "clone", url])

    deps = type(mjx_env.EXTERNAL_DEPS_PATH)(tmp_path / "external_deps")
    monkeypatch.setattr(mjx_env, "EXTERNAL_DEPS_PATH", deps)
    monkeypatch.setattr(mjx_env, "MENAGERIE_PATH", deps / "mujoco_menagerie")
    monkeypatch.setattr(mjx_env, "_clone_with_progress", offline)
    monkeypatch.delenv(playground.MENAGERIE_ENV, raising=False)
    return deps / "mujoco_menagerie"


def test_which_envs_need_menagerie():
    assert playground.needs_menagerie("Go1JoystickFlatTerrain")
    assert playground.needs_menagerie("PandaPickCube")
    assert not playground.needs_menagerie("CartpoleBalance")


def test_no_menagerie_names_the_fix(no_menagerie, no_compile):
    with pytest.raises(FileNotFoundError) as e:
        make_env("playground:PandaPickCube")
    msg = str(e.value)
    assert str(no_menagerie) in msg and "git clone" in msg
    assert playground.menagerie_commit() in msg
    assert "menagerie=" in msg and "MENAGERIE_ROOT=" in msg
    assert not (no_menagerie).exists()


def test_control_suite_needs_no_menagerie(no_menagerie):
    assert make_env("playground:CartpoleBalance").name == "playground:CartpoleBalance"


def test_given_folder_missing(tmp_path, monkeypatch, no_compile):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="menagerie=.*nowhere.*no such"):
        make_env(f"playground:{ENV}", menagerie=missing)
    monkeypatch.setenv(playground.MENAGERIE_ENV, str(missing))
    with pytest.raises(FileNotFoundError, match=r"\$MENAGERIE_ROOT=.*nowhere"):
        make_env(f"playground:{ENV}")


def test_robot_missing_from_checkout(menagerie):
    # The stand-in holds Go1 only: the Panda's files are not there.
    with pytest.raises(ValueError) as e:
        make_env("playground:PandaPickCube", menagerie=menagerie)
    msg = str(e.value)
    assert "mjx_panda.xml" in msg and str(menagerie) in msg
    assert playground.menagerie_commit() in msg


def test_env_var_and_path_put_back(menagerie, monkeypatch):
    from mujoco_playground._src import mjx_env

    before = mjx_env.MENAGERIE_PATH
    monkeypatch.setenv(playground.MENAGERIE_ENV, str(menagerie))
    env = make_env(f"playground:{ENV}")
    assert env.env.mj_model.nmesh == len(GO1_MESHES)
    assert mjx_env.MENAGERIE_PATH is before


def test_meshes_do_not_change_the_physics(menagerie, tmp_path):
    import mujoco

    small = make_env(f"playground:{ENV}", menagerie=menagerie).env.mj_model
    big = stand_in(tmp_path, size=0.3)
    large = make_env(f"playground:{ENV}", menagerie=big).env.mj_model
    assert not np.array_equal(small.mesh_vert, large.mesh_vert)
    for field in ["body_mass", "body_inertia", "body_ipos", "body_iquat"]:
        np.testing.assert_array_equal(getattr(small, field), getattr(large, field))
    meshes = small.geom_type == mujoco.mjtGeom.mjGEOM_MESH
    assert meshes.any() and not small.geom_contype[meshes].any()
    assert not small.geom_conaffinity[meshes].any()


@pytest.fixture(scope="module")
def reference(env):
    """Per seed: (return, length, terminated, {metric: sum}) of a plain loop.

    Episode s is Playground's ``reset(PRNGKey(s))`` then ``step(state, 0)``
    until ``done`` or LENGTH steps (its episode length), the last step's
    reward counted; every seed in one vmapped jit of a scan.
    """
    pg = env.env
    act = jnp.zeros(pg.action_size)

    def episode(seed):
        state = pg.reset(jax.random.PRNGKey(seed))

        def one(state, _):
            state = pg.step(state, act)
            return state, (state.reward, state.done, state.metrics)

        return jax.lax.scan(one, state, None, LENGTH)[1]

    rewards, dones, metrics = jax.jit(jax.vmap(episode))(jnp.asarray(SEEDS))
    out = {}
    for i, seed in enumerate(SEEDS):
        done = np.flatnonzero(np.asarray(dones[i]) > 0.5)
        n = int(done[0]) + 1 if done.size else LENGTH
        sums = {k: float(np.sum(np.asarray(v[i])[:n])) for k, v in metrics.items()}
        ret = float(np.sum(np.asarray(rewards[i])[:n]))
        out[seed] = (ret, n, bool(done.size), sums)
    return out


@pytest.fixture(scope="module")
def result(env):
    return jaxmesh.evaluate(
        policy,
        env,
        num_envs=2,
        seeds=SEEDS,
        scoring=jaxmesh.Scoring(metrics={k: "sum" for k in SMOOTH}),
    )


@pytest.mark.slow  # Go1's MJX step compiles for minutes on 2 cores
def test_evaluate_matches_plain_loop(result, reference):
    assert list(result.seeds) == SEEDS
    for i, seed in enumerate(SEEDS):
        ret, n, term, sums = reference[seed]
        assert result.lengths[i] == n and bool(result.terminated[i]) == term
        assert bool(result.truncated[i]) == (n == LENGTH)
        # The return adds the contact terms (see SMOOTH): within 5e-3 (these
        # returns are 0.05 to 0.3); the smooth terms within 1% of their sums.
        np.testing.assert_allclose(result.returns[i], ret, atol=5e-3)
        for k in SMOOTH:
            np.testing.assert_allclose(result.metrics[k][i], sums[k], rtol=1e-2)
    # The episodes differ from each other (the comparison is not of zeros).
    assert len({round(reference[s][3][SMOOTH[0]], 3) for s in SEEDS}) == len(SEEDS)
    assert max(abs(reference[s][0]) for s in SEEDS) > 0.05
