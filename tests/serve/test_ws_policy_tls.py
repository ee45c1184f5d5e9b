"""``jaxmesh.RemotePolicy("wss://...")`` against ``PolicyServer(tls=...)``:
the TLS connections, read and written without blocking, give the replies
the policy gives when called directly, over plans of more rows than
connections and of fewer."""

from __future__ import annotations

import numpy as np
from serve_models import linear_model, linear_reference

import jaxmesh
from jaxmesh.serve.ws_client import WebsocketPolicy


def test_rows_over_wss_equal_the_policy(pems, monkeypatch):
    # The client trusts the system's CAs: here, the test's own certificate.
    monkeypatch.setenv("SSL_CERT_FILE", str(pems["cert"]))
    obs = np.arange(18, dtype=np.float32).reshape(6, 3) / 7.0
    with jaxmesh.PolicyServer(
        linear_model(),
        tls=(pems["cert"], pems["key"]),
        max_batch=4,
        example={"observation/state": obs[0]},
    ) as server:
        assert server.url.startswith("wss://")
        with WebsocketPolicy(server.url, connections=3) as policy:
            for rows in (6, 1, 4):
                got = policy._plan(obs[:rows])
                want = [linear_reference(x) for x in obs[:rows]]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            assert policy.client.requests == 11
