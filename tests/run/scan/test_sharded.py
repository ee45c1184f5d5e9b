"""Lanes sharded over devices (``Layout(devices=)``) and sharded populations.

XLA's device count is fixed once JAX starts, so the sharded runs happen in one
Jupyter kernel with eight forced CPU devices (``SCRIPT``, which checks every
case and prints ``ok``; the kernel also runs ``notebooks/tpu.ipynb``). Each
sharded run (2, 4 and 8 devices) is compared with the one-device run of the
same policy and budget, which the rest of the suite checks against plain Python
loops; CartPole's episodes on 8 devices are also checked against that plain
loop here (``reference_loop``). The checks that need no
second device run in this process.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import jupyter_kernel
from jax.sharding import Mesh

import jaxmesh
from jaxmesh.core.tally import Fault, Results
from jaxmesh.devices import resolve_mesh
from jaxmesh.run.scan import sharded

TESTS = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import jax
import jax.numpy as jnp
import numpy as np

import jaxmesh
import reference_loop as ref
from jaxmesh.adapt import Previous, State

assert jax.device_count() == 8, jax.devices()
FIELDS = ("returns", "lengths", "terminated", "truncated", "predict_calls", "seeds")


def mlp(key, n_in, n_out, width=32):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (n_in, width)) * 0.5,
        "w2": jax.random.normal(k2, (width, n_out)) * 0.5,
    }


def acrobot_step(p, obs):
    # A float MLP on top of a swing-up rule: lengths vary from seed to seed and
    # one flipped argmax would change an episode (Acrobot is chaotic).
    logits = jnp.tanh(obs @ p["w1"]) @ p["w2"] * 0.3
    logits = logits + obs[5] * jnp.array([-2.0, 0.0, 2.0])
    return jnp.argmax(logits).astype(jnp.int32)


def cartpole_step(p, obs):
    return jnp.argmax(jnp.tanh(obs @ p["w1"]) @ p["w2"]).astype(jnp.int32)


def cartpole_chunk(p, x):
    # A chunk of 4 from a window of 2 frames and the previous action.
    feats = jnp.concatenate([x["obs"].reshape(-1), x["prev"][None] * 1.0])
    logits = (jnp.tanh(feats @ p["w1"]) @ p["w2"]).reshape(4, 2)
    return jnp.argmax(logits, -1).astype(jnp.int32)


chunked = jaxmesh.Model(
    cartpole_chunk,
    spec={"obs": State(stack=2), "prev": Previous()},
    native_chunk=4,
)
key = jax.random.PRNGKey(3)
cases = {
    "acrobot per-step": (acrobot_step, "gymnax:Acrobot-v1", mlp(key, 6, 3), {}),
    "cartpole chunked, window, lead": (
        chunked,
        "gymnax:CartPole-v1",
        mlp(key, 9, 8),
        {"horizon": 4, "chunking": jaxmesh.Chunking(prefetch_lead=2)},
    ),
}
seeds = [int(s) for s in np.random.default_rng(0).integers(0, 2**31 - 1, 37)]


class Order:
    def __init__(self):
        self.seen = []

    def on_episode_end(self, ep):
        self.seen.append(ep.index)


# One device is checked in the parent process (devices=1); a mesh of the
# devices in reverse order stands for 8, with a hook that hears every episode.
# (Each case skips one of 2 and 4 devices to keep the file's time down; every
# count runs.)
reverse = jax.sharding.Mesh(np.array(jax.devices()[::-1]), ("x",))
SEGMENTS = jaxmesh.Layout(segment_steps=64)
eight = {}
for name, (policy, env, params, kw) in cases.items():
    one = jaxmesh.evaluate(
        policy, env, params=params, num_envs=16, seeds=seeds, layout=SEGMENTS, **kw
    )
    assert one.lengths.min() < one.lengths.max(), (name, one.lengths)
    for d in (4, 8) if name.startswith("acrobot") else (2, 8):
        hook = Order()
        run = jaxmesh.evaluate(
            policy,
            env,
            params=params,
            num_envs=16,
            seeds=seeds,
            layout=jaxmesh.Layout(
                segment_steps=64, devices=reverse if d == 8 else d
            ),
            hooks=hook,
            **kw,
        )
        assert hook.seen == list(range(len(seeds))), (name, d, hook.seen)
        for f in FIELDS:
            np.testing.assert_array_equal(
                getattr(run, f), getattr(one, f), err_msg=f"{name}, {d} devices, {f}"
            )
        np.testing.assert_array_equal(run.indices, np.arange(len(seeds)))
        assert run.env_steps == one.env_steps == one.lengths.sum(), (name, d)
        assert run.plan_tile == one.plan_tile and run.num_envs == 16
        # Device k runs episodes k, k + d, ... on lanes 16 / d * k ...
        lanes_per = 16 // d
        assert np.all(run.lanes // lanes_per == np.arange(len(seeds)) % d), name
    eight[name] = run
    print(name, "ok:", one.lengths.min(), "to", one.lengths.max(), "steps")

# The cached sharded program runs another budget (fewer episodes than devices)
# and other params without compiling.
policy, env, _, kw = cases["acrobot per-step"]
other = mlp(jax.random.PRNGKey(9), 6, 3)
again = jaxmesh.evaluate(
    policy, env, params=other, num_envs=16, seeds=seeds[:5],
    layout=jaxmesh.Layout(segment_steps=64, devices=reverse), **kw
)
assert again.compile_time == 0.0 and again.num_episodes == 5
one = jaxmesh.evaluate(
    policy, env, params=other, num_envs=16, seeds=seeds[:5], layout=SEGMENTS, **kw
)
np.testing.assert_array_equal(again.lengths, one.lengths)
ev = jaxmesh.Evaluator(
    policy, env, num_envs=16, takes_params=True, layout=jaxmesh.Layout(devices=2)
)
assert type(ev) is jaxmesh.Evaluator and ev.placement.lanes_per_device == 8

# CartPole's run on 8 devices against the plain loop (independent of the
# engine): a window of 2 frames, the previous executed action, h = 4, lead 2.
import gymnax

reset, step = ref.gymnax_fns(*gymnax.make("CartPole-v1"))
_, _, p, _ = cases["cartpole chunked, window, lead"]
chunk_ref = jax.jit(lambda x: cartpole_chunk(p, x))


def window(obs_h, act_h, t):
    frames = jnp.stack([obs_h[max(i, 0)] for i in (t - 1, t)])
    return {"obs": frames, "prev": act_h[t - 1] if t > 0 else jnp.int32(0)}


refs = [
    ref.run_episode(
        reset, step, lambda x, k: chunk_ref(x), s, horizon=4, lead=2, inputs=window
    )
    for s in seeds
]
ref.assert_matches(eight["cartpole chunked, window, lead"], refs)
p = mlp(key, 4, 2)

# A NaN reward on step 3 of every episode: each device stops at its own; the
# error names episode 0, as on one device, and no episode has finished.
nan_env = ref.NanRewardAt(jaxmesh.make_env("gymnax:CartPole-v1"), 3)
try:
    jaxmesh.evaluate(
        cartpole_step, nan_env, params=p, num_envs=16, episodes=20,
        layout=jaxmesh.Layout(devices="all"),
    )
    raise AssertionError("no BadValueError")
except jaxmesh.BadValueError as exc:
    assert (exc.episode, exc.step, exc.seed) == (0, 3, 0), exc
    assert exc.partial_result.num_episodes == 0

# Populations: shard_population equals the unsharded vmap, bit for bit.
run = jaxmesh.make_evaluator(
    acrobot_step, "gymnax:Acrobot-v1", seeds=seeds[:12], num_envs=4
)
population = jax.vmap(lambda k: mlp(k, 6, 3))(jax.random.split(key, 8))
other = jnp.asarray([int(s) + 1 for s in seeds[:12]], jnp.int32)
want = jax.jit(jax.vmap(run, in_axes=(0, None)))(population, other)
got = jaxmesh.shard_population(run, devices="all")(population, other)
assert got.returns.sharding.num_devices == 8
for f in FIELDS[:-1]:
    np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
assert len(set(np.asarray(got.returns).sum(1).tolist())) > 1  # members differ
print("ok")
"""


KERNEL = "jaxmesh-sharded"


@pytest.fixture(scope="module")
def eight_cpu_devices(tmp_path_factory: pytest.TempPathFactory):
    """One Jupyter kernel that sees 8 forced CPU devices, for the two tests below.

    Starting a process with JAX and jaxmesh costs seconds, so both use this
    one: ``tpu.ipynb`` first, in the kernel as it started (a notebook must not
    lean on names another run left behind), then ``SCRIPT``, in a namespace of
    its own (run alone, or first, SCRIPT finds the kernel unused: no matter).
    """
    root = tmp_path_factory.mktemp("kernel")
    env = {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    with jupyter_kernel(root, KERNEL, env) as km:
        yield {"km": km, "used": False, "path": str(root / "jupyter")}


def run_in(kernel: dict, nb, *, fresh: bool) -> None:
    """Runs every cell of ``nb`` in the shared kernel; ``fresh``: in a kernel no
    other cell ran in (a new one of the same spec if the shared one was used)."""
    import nbclient

    if fresh and kernel["used"]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("JUPYTER_PATH", kernel["path"])
            nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300).execute()
        return
    kernel["used"] = True
    nbclient.NotebookClient(nb, km=kernel["km"], timeout=300).execute()


@pytest.mark.slow  # a kernel with 8 forced devices; make test: devices=1 below
def test_tpu_notebook_runs_on_8_cpu_devices(eight_cpu_devices):
    # notebooks/tpu.ipynb, stored without outputs, runs top to bottom (its cells
    # assert what they show) in a kernel that sees 8 forced CPU devices.
    import nbformat

    nb = nbformat.read(TESTS.parent / "notebooks" / "tpu.ipynb", as_version=4)
    nbformat.validate(nb)
    assert not [c for c in nb.cells if c.cell_type == "code" and c.outputs]
    nb.cells.append(nbformat.v4.new_code_cell("import jax; print(jax.device_count())"))
    run_in(eight_cpu_devices, nb, fresh=True)
    assert nb.cells[-1].outputs[0]["text"].strip() == "8"


@pytest.mark.slow  # the same kernel; make test: devices=1 and the split below
def test_sharded_runs_equal_one_device_runs_on_1_2_4_8_devices(eight_cpu_devices):
    import nbformat

    # SCRIPT in a fresh namespace; the evaluators the notebook left are dropped
    # so that SCRIPT's own cache checks see only its own programs.
    # (linecache: a failure's traceback shows SCRIPT's lines.)
    cell = (
        "import linecache, sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "import jaxmesh\n"
        "jaxmesh.clear_cache()\n"
        f"src = {SCRIPT!r}\n"
        "linecache.cache['SCRIPT'] = (len(src), None, src.splitlines(True), 'SCRIPT')\n"
        "exec(compile(src, 'SCRIPT', 'exec'), {'__name__': 'SCRIPT'})\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    # A failing assertion raises CellExecutionError, with SCRIPT's traceback.
    run_in(eight_cpu_devices, nb, fresh=False)
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert out.strip().endswith("ok"), out


def test_devices_values():
    assert resolve_mesh(None) is None
    mesh = resolve_mesh("all")
    assert mesh.axis_names == ("lanes",) and mesh.devices.size == jax.device_count()
    assert resolve_mesh(1).devices.size == 1
    assert resolve_mesh([jax.devices()[0]]).devices.size == 1
    given = Mesh(np.array(jax.devices()), ("x",))
    assert resolve_mesh(given) is given
    with pytest.raises(ValueError, match="expected 1 to"):
        resolve_mesh(jax.device_count() + 1)
    with pytest.raises(ValueError, match="'all'"):
        resolve_mesh("every")
    with pytest.raises(TypeError, match="one-axis"):
        resolve_mesh(2.0)
    with pytest.raises(ValueError, match="one axis"):
        resolve_mesh(Mesh(np.array(jax.devices()).reshape(1, -1), ("a", "b")))


def test_uneven_lanes_are_refused_before_compiling():
    with pytest.raises(
        ValueError, match=r"num_envs=10 .* 4 devices.*\(e\.g\. 8 or 12\)"
    ):
        sharded.split_lanes(10, 4)
    assert sharded.split_lanes(12, 4) == 3


def test_host_stepped_envs_refuse_devices():
    import gymnasium as gym

    with pytest.raises(ValueError, match="JAX envs only"):
        jaxmesh.evaluate(
            lambda o: 0, gym.make("CartPole-v1"), layout=jaxmesh.Layout(devices="all")
        )


def test_one_device_mesh_equals_the_plain_run():
    policy = lambda obs: (obs[2] > 0).astype(np.int32)
    a = jaxmesh.evaluate(policy, "gymnax:CartPole-v1", num_envs=4, episodes=9)
    b = jaxmesh.evaluate(
        policy,
        "gymnax:CartPole-v1",
        num_envs=4,
        episodes=9,
        layout=jaxmesh.Layout(devices=1),
    )
    np.testing.assert_array_equal(a.returns, b.returns)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.lanes, b.lanes)


def test_merge_logs_renumbers_episodes_and_lanes():
    # Two devices, logs of 3 rows, two lanes each, worked by hand: device d's
    # local episode k is episode 2k + d; device 1's lane j is lane 2 + j. Device
    # 0 wrote two rows (its episodes 1 and 0), device 1 one (its episode 0);
    # rows past ``rows`` are stale and dropped.
    fault = Fault(
        kind=np.array([[0, 1], [0, 0]]),
        episode=np.array([[0, 2], [0, 0]]),
        step=np.array([[0, 5], [0, 0]]),
        value=np.array([[0.0, 9.0], [0.0, 0.0]], np.float32),
    )
    per_row = lambda a, b: np.array([a, b])
    stacked = Results(
        returns=per_row([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]),
        lengths=per_row([1, 2, 3], [4, 5, 6]),
        terminated=per_row([1, 0, 0], [0, 1, 0]).astype(bool),
        truncated=per_row([0, 0, 0], [0, 0, 1]).astype(bool),
        predict_calls=per_row([1, 1, 1], [2, 2, 2]),
        lanes=per_row([1, 0, 0], [1, 0, 1]),
        done=per_row([1, 1, 0], [1, 0, 0]).astype(bool),
        env_steps=np.array([6, 9]),
        policy_rows=np.array([16, 32]),
        fault=fault,
        index=per_row([1, 0, 7], [0, 7, 7]),
        rows=np.array([2, 1]),
    )
    m = sharded.merge_logs(stacked, lanes=2)
    assert m.rows == 3
    np.testing.assert_array_equal(m.index, [2, 0, 1])
    np.testing.assert_array_equal(m.returns, [1, 2, 10])
    np.testing.assert_array_equal(m.lengths, [1, 2, 4])
    np.testing.assert_array_equal(m.lanes, [1, 0, 3])
    assert m.env_steps == 15 and m.policy_rows == 48
    np.testing.assert_array_equal(m.fault.kind, [0, 1, 0, 0])
    # Device 0's local episode 2 is episode 4.
    assert m.fault.first() == {
        "kind": 1,
        "episode": 4,
        "step": 5,
        "lane": 1,
        "value": 9.0,
    }


def test_device_shares():
    shares = sharded.device_seeds(np.arange(10), 4)
    assert [s.tolist() for s in shares] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
