"""The served forward and the batcher, without sockets: padding to fixed batch
sizes with nothing compiled after warm-up, grouping of concurrent requests,
and faults that fail only their own request."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiles
from serve_models import linear_model, linear_reference

import jaxmesh
from jaxmesh.adapt import PendingChunk, Previous, State, Text
from jaxmesh.serve.batcher import Batcher, ServerClosed
from jaxmesh.serve.forward import RequestError, ServedModel, batch_sizes


def state_obs(i: int) -> dict:
    return {"observation/state": np.array([i, -i, 0.5 * i], np.float32), "prompt": "x"}


def test_batch_sizes_are_powers_of_two_then_the_maximum():
    assert batch_sizes(1) == (1,)
    assert batch_sizes(5) == (1, 2, 4, 5)
    assert batch_sizes(16) == (1, 2, 4, 8, 16)


def test_padded_batches_equal_the_reference_and_compile_nothing_after_warm_up():
    served = ServedModel(linear_model(), max_batch=8)
    served.warm_up(served.prepare(state_obs(0)))
    assert served.compiled() == len(batch_sizes(8))  # 1, 2, 4, 8
    with compiles() as seen:
        for n in (1, 3, 5, 8, 7, 2):  # padded to 1, 4, 8, 8, 8, 2
            rows = [served.prepare(state_obs(10 * n + i)) for i in range(n)]
            done = served.run(rows)
            assert done.padded == next(s for s in (1, 2, 4, 8) if s >= n)
            for i, out in enumerate(done.outputs):
                ref = linear_reference(state_obs(10 * n + i)["observation/state"])
                np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert seen == [], f"compiled after warm-up: {seen}"
    assert served.compiled() == 4


def test_a_batch_takes_every_connected_clients_request():
    served = ServedModel(linear_model(), max_batch=4)
    served.warm_up(served.prepare(state_obs(0)))
    batcher = Batcher(served, max_wait_ms=60_000)
    for _ in range(6):
        batcher.connect()
    batcher.start()
    try:
        futures = [batcher.submit(served.prepare(state_obs(i))) for i in range(6)]
        first = [f.result(timeout=30) for f in futures[:4]]
        # Two requests wait for the other four clients; as those leave, the
        # batcher sees that no one else can add to the batch, and runs it.
        for _ in range(4):
            batcher.disconnect()
        last = [f.result(timeout=30) for f in futures[4:]]
    finally:
        batcher.close()
    assert [r.batch_size for r in first + last] == [4, 4, 4, 4, 2, 2]
    assert batcher.stats.batch_sizes == {4: 1, 2: 1}
    for i, reply in enumerate(first + last):
        ref = linear_reference(state_obs(i)["observation/state"])
        np.testing.assert_allclose(reply.output, ref, rtol=1e-6, atol=1e-6)
        assert reply.queue_ms >= 0 and reply.forward_ms > 0


def test_a_request_the_model_cannot_run_fails_alone():
    served = ServedModel(linear_model(), max_batch=4)
    batcher = Batcher(served, max_wait_ms=0)
    batcher.connect()
    batcher.connect()
    batcher.start()
    try:
        good = batcher.submit(served.prepare(state_obs(1)))
        # Another layout: five numbers where the weights take three.
        bad_obs = {"observation/state": np.ones(5, np.float32)}
        bad = batcher.submit(served.prepare(bad_obs))
        ref = linear_reference(state_obs(1)["observation/state"])
        np.testing.assert_allclose(good.result(timeout=60).output, ref, rtol=1e-6)
        with pytest.raises(RequestError, match="cannot run these inputs"):
            bad.result(timeout=60)
        # The layout is remembered: refused before it is queued.
        with pytest.raises(RequestError, match="cannot run these inputs"):
            served.prepare(bad_obs)
        # A key the spec reads is missing: refused on the host, naming it.
        with pytest.raises(RequestError, match="'observation/state'.*lacks"):
            served.prepare({"state": np.ones(3, np.float32)})
        with pytest.raises(RequestError, match="dtype <U"):
            served.prepare({"observation/state": np.array(["a", "b", "c"])})
        again = batcher.submit(served.prepare(state_obs(2)))
        ref = linear_reference(state_obs(2)["observation/state"])
        np.testing.assert_allclose(again.result(timeout=60).output, ref, rtol=1e-6)
    finally:
        batcher.close()
    assert batcher.stats.failed == 1


def test_a_request_whose_client_left_is_dropped_and_close_fails_the_rest():
    served = ServedModel(linear_model(), max_batch=4)
    served.warm_up(served.prepare(state_obs(0)))
    batcher = Batcher(served, max_wait_ms=60_000)
    for _ in range(3):
        batcher.connect()
    batcher.start()
    gone = batcher.submit(served.prepare(state_obs(1)))
    assert gone.cancel()  # its client went while it waited
    kept = batcher.submit(served.prepare(state_obs(2)))
    batcher.disconnect()
    batcher.disconnect()  # one client left, one request queued: it runs
    assert kept.result(timeout=30).batch_size == 1
    assert batcher.stats.dropped == 1
    waiting = batcher.submit(served.prepare(state_obs(3)))
    batcher.connect()  # two clients, one request: it waits for the other
    batcher.close()
    with pytest.raises(ServerClosed):
        waiting.result(timeout=30)
    with pytest.raises(ServerClosed):
        batcher.submit(served.prepare(state_obs(4)))


def test_text_inputs_read_the_prompt_and_whole_observations_drop_strings():
    def encode(s):
        return np.array([len(s), ord(s[0])], np.int32)

    def fn(inputs):
        return inputs["task"].astype(jnp.float32) + inputs["state"][0]

    served = ServedModel(
        jaxmesh.Model(
            fn, spec={"task": Text(encode), "state": State(key="observation/state")}
        ),
        max_batch=2,
    )
    obs = state_obs(3)
    obs["prompt"] = "open the drawer"
    out = served.run([served.prepare(obs)]).outputs[0]
    np.testing.assert_array_equal(out, [[15 + 3, ord("o") + 3]])  # [1, A]: one action
    with pytest.raises(RequestError, match="'prompt'.*missing"):
        served.prepare({"observation/state": np.ones(3, np.float32)})

    whole = ServedModel(lambda obs: obs["observation/state"] * 2.0, max_batch=2)
    out = whole.run([whole.prepare(state_obs(2))]).outputs[0]
    np.testing.assert_allclose(out, [[4.0, -4.0, 2.0]])


@pytest.mark.parametrize(
    "spec, why",
    [
        ({"obs": State(stack=2)}, "window of 2 frames"),
        ({"obs": State(), "prev": Previous()}, "Previous"),
        ({"obs": State(), "tail": PendingChunk(length=4)}, "PendingChunk"),
    ],
)
def test_a_model_with_episode_state_is_refused(spec, why):
    with pytest.raises(ValueError, match=why):
        ServedModel(jaxmesh.Model(lambda x: x["obs"], spec=spec), max_batch=2)


def test_a_recurrent_model_is_refused():
    class Recurrent(jaxmesh.Model):
        def initial_state(self):
            return jnp.zeros(())

        def predict(self, obs, state):
            return obs, state

    with pytest.raises(ValueError, match="recurrent"):
        ServedModel(Recurrent(), max_batch=2)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, 5000])
def test_bad_max_batch_is_refused(bad):
    with pytest.raises(ValueError, match="max_batch"):
        ServedModel(linear_model(), max_batch=bad)


def test_a_stochastic_policy_draws_with_fold_in_of_the_seed_and_request_index():
    def draw(obs, key):
        return jax.random.uniform(key, (2,)) + obs["observation/state"][0]

    served = ServedModel(draw, max_batch=4, seed=7)
    rows = [served.prepare(state_obs(0)) for _ in range(3)]
    first = served.run(rows).outputs + served.run(rows[:1]).outputs
    for i, out in enumerate(first):  # requests 0, 1, 2, then 3
        key = jax.random.fold_in(jax.random.PRNGKey(7), i)
        np.testing.assert_allclose(out, [np.asarray(jax.random.uniform(key, (2,)))])


def test_a_lone_clients_request_runs_in_its_own_thread_else_it_queues():
    served = ServedModel(linear_model(), max_batch=4)
    served.warm_up(served.prepare(state_obs(0)))
    batcher = Batcher(served, max_wait_ms=60_000)
    batcher.connect()
    batcher.start()
    try:
        reply = batcher.run_alone(served.prepare(state_obs(3)))
        ref = linear_reference(state_obs(3)["observation/state"])
        np.testing.assert_allclose(reply.output, ref, rtol=1e-6, atol=1e-6)
        assert (reply.batch_size, batcher.stats.requests) == (1, 1)
        batcher.connect()  # a second client: requests go to the queue
        assert batcher.run_alone(served.prepare(state_obs(4))) is None
        batcher.disconnect()
    finally:
        batcher.close()
    assert batcher.run_alone(served.prepare(state_obs(5))) is None  # closed


def test_a_forward_waits_only_for_clients_of_its_own_group():
    # Two clients of group "a" and one of group "b" (whose requests can never
    # join a's forward): with a minute's wait, a's two requests run as soon as
    # both are queued, without waiting for b; b's then runs alone at once.
    served = ServedModel(linear_model(), max_batch=4)
    first = served.prepare(state_obs(0))
    served.warm_up(first)
    batcher = Batcher(served, max_wait_ms=60_000)
    for group in ("a", "a", "b"):
        batcher.connect(group)

    def request(i: int, group: str):
        return served.prepare(state_obs(i))._replace(signature=group)

    batcher.start()
    try:
        a = [batcher.submit(request(i, "a")) for i in (1, 2)]
        got = [f.result(timeout=30) for f in a]
        reply = batcher.run_alone(request(3, "b"))  # b's lone client
    finally:
        for group in ("a", "a", "b"):
            batcher.disconnect(group)
        batcher.close()
    assert [r.batch_size for r in got] == [2, 2]
    assert reply is not None and reply.batch_size == 1
    for i, r in zip((1, 2, 3), [*got, reply], strict=True):
        ref = linear_reference(state_obs(i)["observation/state"])
        np.testing.assert_allclose(r.output, ref, rtol=1e-6, atol=1e-6)


def test_a_chunk_the_model_does_not_declare_warns_once():
    def chunk(inputs):  # a chunk of 5 actions of 7, not declared
        return jnp.broadcast_to(inputs["state"][:1], (5, 7))

    spec = {"state": State(key="observation/state")}
    served = ServedModel(jaxmesh.Model(chunk, spec=spec), max_batch=2)
    with pytest.warns(UserWarning, match=r"shape \(5, 7\).*native_chunk=K"):
        out = served.run([served.prepare(state_obs(1))]).outputs[0]
    assert out.shape == (1, 5, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        served.run([served.prepare(state_obs(2))])  # once only
    declared = ServedModel(
        jaxmesh.Model(
            chunk, spec={"state": State(key="observation/state")}, native_chunk=5
        ),
        max_batch=2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert declared.run([declared.prepare(state_obs(1))]).outputs[0].shape == (5, 7)
