"""``Batcher.run_ready``: the request that completes a batch (every connected
client's request queued) runs it in its own thread, and the replies equal
the policy called directly; a lazy request wakes the forward thread only
when poked."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
from serve_models import linear_model, linear_reference

from jaxmesh.serve.batcher import Batcher
from jaxmesh.serve.forward import ServedModel


def state_obs(i: int) -> dict:
    return {"observation/state": np.arange(3, dtype=np.float32) + i}


def test_the_request_that_completes_a_batch_runs_it_in_its_own_thread():
    # No forward thread started: the batch can only run in run_ready's caller.
    served = ServedModel(linear_model(), max_batch=4)
    served.warm_up(served.prepare(state_obs(0)))
    batcher = Batcher(served, max_wait_ms=60_000)
    for _ in range(3):
        batcher.connect()
    try:
        first = [batcher.run_ready(served.prepare(state_obs(i))) for i in (1, 2)]
        assert not any(f.done() for f in first)  # the third client may still send
        last = batcher.run_ready(served.prepare(state_obs(3)))
        for i, future in zip((1, 2, 3), [*first, last], strict=True):
            reply = future.result(timeout=0)  # done before run_ready returned
            ref = linear_reference(state_obs(i)["observation/state"])
            np.testing.assert_allclose(reply.output, ref, rtol=1e-6, atol=1e-6)
            assert reply.batch_size == 3
        assert batcher.stats.batch_sizes == {3: 1}
        # A client gone: the two left complete a batch of two.
        batcher.disconnect()
        pair = [batcher.run_ready(served.prepare(state_obs(i))) for i in (4, 5)]
        assert [f.result(timeout=0).batch_size for f in pair] == [2, 2]
    finally:
        batcher.close()


def test_a_lazy_request_waits_for_a_poke_to_wake_the_forward_thread():
    served = ServedModel(linear_model(), max_batch=4)
    served.warm_up(served.prepare(state_obs(0)))
    batcher = Batcher(served, max_wait_ms=0)
    batcher.connect()
    batcher.connect()  # a second client that never sends
    batcher.start()
    try:
        eager = batcher.run_ready(served.prepare(state_obs(1)))
        assert eager.result(timeout=30).batch_size == 1  # its deadline: now
        lazy = batcher.run_ready(served.prepare(state_obs(2)), lazy=True)
        with pytest.raises(concurrent.futures.TimeoutError):
            lazy.result(timeout=0.3)  # the forward thread sleeps on
        batcher.poke()
        reply = lazy.result(timeout=30)
        ref = linear_reference(state_obs(2)["observation/state"])
        np.testing.assert_allclose(reply.output, ref, rtol=1e-6, atol=1e-6)
    finally:
        batcher.close()
