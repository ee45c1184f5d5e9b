"""``jaxmesh.RemotePolicy`` against ``PolicyServer(protocol="grpc")``: a run
with the served model gives the run of the model in process, episode by
episode (returns, lengths, actions), and both give what a plain loop over
the gymnasium env and the model's forward in numpy gives."""

from __future__ import annotations

import socket
import threading

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh
from jaxmesh.adapt import Previous, State
from jaxmesh.errors import RemoteConnectionError

SEEDS = [3, 17, 4, 99, 12]
STEPS = 30  # max_episode_steps: short episodes
W = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (9, 2)) * 0.5, np.float32)
V = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (3, 4)), np.float32)


class Stacked(jaxmesh.Model):
    """CartPole: the last two observations and the previous action."""

    spec = {"obs": State(key=None, stack=2), "prev": Previous()}
    params = {"w": W}

    def predict(self, inputs):
        prev = inputs["prev"].reshape(-1).astype(jnp.float32)
        x = jnp.concatenate([inputs["obs"].reshape(-1), prev])
        return jnp.argmax(x @ self.params["w"])


def stacked_numpy(window: np.ndarray, prev: int) -> int:
    """``Stacked``'s forward in numpy: window [2, 4], oldest first."""
    x = np.concatenate([window.reshape(-1), [np.float32(prev)]]).astype(np.float32)
    return int(np.argmax(x @ W))


class Chunked(jaxmesh.Model):
    """Pendulum: a chunk of 4 torques from the observation."""

    native_chunk = 4

    def predict_chunk(self, obs):
        return jnp.tanh(obs @ V)[:, None] * 2.0


def plain_stacked(seeds: list[int]) -> tuple[list[float], list[int], list[list[int]]]:
    """Each episode on its own CartPole: the window starts full of the reset
    observation and the previous action at 0, one forward per step."""
    returns, lengths, actions = [], [], []
    env = gymnasium.make("CartPole-v1")
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            obs = np.asarray(obs, np.float32)
            window, prev, total, acts = np.stack([obs, obs]), 0, 0.0, []
            for _ in range(STEPS):
                a = stacked_numpy(window, prev)
                obs, r, te, tr, _ = env.step(a)
                window = np.stack([window[1], np.asarray(obs, np.float32)])
                prev, total = a, total + float(r)
                acts.append(a)
                if te or tr:
                    break
            returns.append(total)
            lengths.append(len(acts))
            actions.append(acts)
    finally:
        env.close()
    return returns, lengths, actions


def run(policy, env, lanes, **kw):
    record = jaxmesh.Record(episodes=list(range(len(SEEDS))), frames=False)
    kw.setdefault("workers", 0)
    return jaxmesh.evaluate(
        policy,
        env,
        seeds=SEEDS,
        num_envs=lanes,
        max_episode_steps=STEPS,
        record=record,
        **kw,
    )


def assert_same(got, want) -> None:
    np.testing.assert_array_equal(got.returns, want.returns)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.predict_calls, want.predict_calls)
    for i in range(len(SEEDS)):
        np.testing.assert_array_equal(
            got.trajectory(i).actions, want.trajectory(i).actions
        )


@pytest.fixture(scope="module")
def in_process():
    """The in-process runs the served ones must equal, by lanes."""
    return {n: run(Stacked(), "gymnasium:CartPole-v1", n) for n in (1, 3)}


def test_the_in_process_run_is_the_plain_loop(in_process):
    returns, lengths, actions = plain_stacked(SEEDS)
    for res in in_process.values():
        np.testing.assert_array_equal(res.returns, returns)
        np.testing.assert_array_equal(res.lengths, lengths)
        for i, acts in enumerate(actions):
            np.testing.assert_array_equal(res.trajectory(i).actions, acts)


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_served_stateful_model_equals_it_in_process(in_process, lanes):
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc") as server:
        got = run(jaxmesh.RemotePolicy(server.url), "gymnasium:CartPole-v1", lanes)
        assert server.stats.failed == 0
    assert_same(got, in_process[lanes])
    assert got.policy == f"remote:{server.address}"


def test_chunks_at_horizon_above_one_equal_in_process():
    env = "gymnasium:Pendulum-v1"
    want = {n: run(Chunked(), env, n, horizon=3) for n in (1, 3)}
    with jaxmesh.PolicyServer(Chunked(), protocol="grpc") as server:
        for n in (1, 3):
            got = run(jaxmesh.RemotePolicy(server.url), env, n, horizon=3)
            assert_same(got, want[n])
            # One plan per 3 steps (the chunk replayed on the host between).
            np.testing.assert_array_equal(got.predict_calls, -(-got.lengths // 3))


class Recurrent(jaxmesh.Model):
    """Pendulum: a torque from a decaying sum of the observations."""

    def initial_state(self):
        return jnp.zeros(3, jnp.float32)

    def predict(self, obs, state):
        state = 0.9 * state + obs
        return jnp.tanh(state @ V[:, :1]) * 2.0, state


def plain_recurrent(seeds: list[int]) -> list[float]:
    returns = []
    env = gymnasium.make("Pendulum-v1")
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            state, total = np.zeros(3, np.float32), 0.0
            for _ in range(STEPS):
                state = np.float32(0.9) * state + np.asarray(obs, np.float32)
                obs, r, te, tr, _ = env.step(np.tanh(state @ V[:, :1]) * 2.0)
                total += float(r)
                if te or tr:
                    break
            returns.append(total)
    finally:
        env.close()
    return returns


def test_a_recurrent_models_state_is_kept_per_lane_and_reset_per_episode():
    want = run(Recurrent(), "gymnasium:Pendulum-v1", 3)
    np.testing.assert_allclose(want.returns, plain_recurrent(SEEDS), rtol=1e-4)
    with jaxmesh.PolicyServer(Recurrent(), protocol="grpc") as server:
        got = run(jaxmesh.RemotePolicy(server.url), "gymnasium:Pendulum-v1", 3)
    assert_same(got, want)


class DictCartPole(gymnasium.ObservationWrapper):
    """CartPole whose observation is ``{"state": [4], "noise": [3]}``."""

    def __init__(self):
        super().__init__(gymnasium.make("CartPole-v1"))
        self.observation_space = gymnasium.spaces.Dict(
            {
                "noise": gymnasium.spaces.Box(-1, 1, (3,)),
                "state": self.env.observation_space,
            }
        )

    def observation(self, obs):
        return {"noise": np.full(3, 0.5, np.float32), "state": obs}


class ReadsState(jaxmesh.Model):
    spec = {"state": State(key="state")}

    def predict(self, obs):
        return (obs["state"] @ W[4:8, 0] > 0).astype(jnp.int32)


def test_only_the_leaves_the_served_policy_reads_are_sent():
    want = run(ReadsState(), [DictCartPole() for _ in range(2)], 2)
    with jaxmesh.PolicyServer(ReadsState(), protocol="grpc") as server:
        policy = jaxmesh.RemotePolicy(server.url)
        got = run(policy, [DictCartPole() for _ in range(2)], 2)
    assert_same(got, want)


def test_two_clients_at_once_share_forwards_and_get_their_own_results(in_process):
    got: dict = {}
    errors: list = []

    def client(name: str, lanes: int) -> None:
        try:
            got[name] = run(
                jaxmesh.RemotePolicy(address), "gymnasium:CartPole-v1", lanes
            )
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    # A long wait: a forward waits for both clients' steps, so rows of both
    # runs share forwards.
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc", max_wait_ms=200) as server:
        address = server.url
        threads = [
            threading.Thread(target=client, args=("a", 1)),
            threading.Thread(target=client, args=("b", 3)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stats = server.stats
    assert not errors, errors
    assert_same(got["a"], in_process[1])
    assert_same(got["b"], in_process[3])
    assert stats.batch_sizes.get(2, 0) > 0  # steps of both in one forward


def test_a_token_is_required_when_set(in_process):
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc", token="s3cret") as server:
        with pytest.raises(RemoteConnectionError, match="token"):
            run(jaxmesh.RemotePolicy(server.url), "gymnasium:CartPole-v1", 1)
        with pytest.raises(RemoteConnectionError, match="wrong token"):
            run(
                jaxmesh.RemotePolicy(server.url, token="nope"),
                "gymnasium:CartPole-v1",
                1,
            )
        got = run(
            jaxmesh.RemotePolicy(server.url, token="s3cret"),
            "gymnasium:CartPole-v1",
            1,
        )
    assert_same(got, in_process[1])


@pytest.mark.slow
def test_tls(pems, in_process):
    tls = (pems["cert"], pems["key"])
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc", tls=tls) as server:
        assert server.url.startswith("grpcs://127.0.0.1:")
        policy = jaxmesh.RemotePolicy(server.url, tls=str(pems["cert"]))
        got = run(policy, "gymnasium:CartPole-v1", 1)
    assert_same(got, in_process[1])


def test_a_server_that_shuts_down_mid_run_keeps_the_finished_episodes(in_process):
    server = jaxmesh.PolicyServer(Stacked(), protocol="grpc").start()
    ended: list = []

    class StopAfterTwo:
        def on_episode_end(self, episode):
            ended.append(episode)
            if len(ended) == 2:
                server.shutdown()

    try:
        with pytest.raises(RemoteConnectionError, match=server.address) as info:
            run(
                jaxmesh.RemotePolicy(server.url),
                "gymnasium:CartPole-v1",
                1,
                hooks=[StopAfterTwo()],
            )
    finally:
        server.shutdown()
    assert "resume=" in str(info.value)
    partial = info.value.partial_result
    assert partial is not None
    done = [e.index for e in partial.episodes]
    assert done == [0, 1]
    want = in_process[1]
    np.testing.assert_array_equal(partial.returns[:2], want.returns[:2])


def test_an_unreachable_server_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = jaxmesh.RemotePolicy(f"127.0.0.1:{port}", connect_timeout=0.3)
    with pytest.raises(RemoteConnectionError, match=f"127.0.0.1:{port}.*serve-policy"):
        run(policy, "gymnasium:CartPole-v1", 1)


def test_a_policy_that_does_not_fit_the_env_is_refused_at_the_start():
    with jaxmesh.PolicyServer(Chunked(), protocol="grpc") as server:
        with pytest.raises(ValueError, match="refused"):
            run(jaxmesh.RemotePolicy(server.url), "gymnasium:CartPole-v1", 1)


def test_params_are_refused():
    policy = jaxmesh.RemotePolicy("127.0.0.1:1")
    with pytest.raises(TypeError, match="params"):
        jaxmesh.evaluate(policy, "gymnasium:CartPole-v1", episodes=1, params={})


@pytest.mark.slow
def test_a_jax_env_is_refused():
    policy = jaxmesh.RemotePolicy("127.0.0.1:1")
    with pytest.raises(TypeError, match="host-stepped"):
        jaxmesh.evaluate(policy, "gymnax:CartPole-v1", episodes=1)


@pytest.mark.slow
def test_workers_equal_in_process(in_process):
    with jaxmesh.PolicyServer(Stacked(), protocol="grpc") as server:
        policy = jaxmesh.RemotePolicy(server.url)
        got = run(policy, "gymnasium:CartPole-v1", 3, workers=2)
    assert_same(got, in_process[3])


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, env, horizon, lead",
    [
        (Stacked, "gymnasium:CartPole-v1", 1, 0),
        # Chunks sent ahead as segments, with a prefetched next chunk.
        (Chunked, "gymnasium:Pendulum-v1", 3, 1),
    ],
)
def test_served_envs_equal_in_process(model, env, horizon, lead):
    record = jaxmesh.Record(episodes=list(range(len(SEEDS))), frames=False)
    kw = {"seeds": SEEDS, "max_episode_steps": STEPS, "record": record}
    kw.update(horizon=horizon, chunking=jaxmesh.Chunking(prefetch_lead=lead))
    with jaxmesh.EnvServer(env, lanes=3) as envs:
        address = f"grpc://{envs.address}"
        want = jaxmesh.evaluate(model(), address, **kw)
        with jaxmesh.PolicyServer(model(), protocol="grpc") as server:
            got = jaxmesh.evaluate(jaxmesh.RemotePolicy(server.url), address, **kw)
    assert_same(got, want)


@pytest.mark.slow
def test_serve_policy_grpc_in_a_real_process(in_process):
    from .conftest import serve_policy_process

    with serve_policy_process(
        "serve.test_remote_policy:Stacked", "--protocol", "grpc"
    ) as address:
        got = run(jaxmesh.RemotePolicy(address), "gymnasium:CartPole-v1", 3)
    assert_same(got, in_process[3])


class Noisy(jaxmesh.Model):
    """CartPole: a random push, likelier to the side the pole leans."""

    def predict(self, obs, key):
        p = jax.nn.sigmoid(obs[2] * 10)
        return jax.random.bernoulli(key, p).astype(jnp.int32)


@pytest.mark.slow
def test_a_stochastic_model_draws_the_keys_it_draws_in_process():
    want = run(Noisy(), "gymnasium:CartPole-v1", 3)
    with jaxmesh.PolicyServer(Noisy(), protocol="grpc") as server:
        got = run(jaxmesh.RemotePolicy(server.url), "gymnasium:CartPole-v1", 3)
    assert_same(got, want)
