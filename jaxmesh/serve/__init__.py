"""Serving a policy: one jitted model behind many clients, batched.

``PolicyServer`` (``server.py``) runs a model for clients that step their own
simulators or robots elsewhere, speaking openpi's websocket protocol
(``openpi.py``; ``openpi-client``'s ``WebsocketClientPolicy`` works against it
unchanged). Requests from all connections share one queue (``batcher.py``);
a forward runs up to ``max_batch`` of them through a program compiled for a
few fixed batch sizes (``forward.py``, which also applies the model's spec to
raw observations). ``codec.py`` is openpi's msgpack format, without pickle.

jaxmesh's own protocol (``protocol="grpc"``, ``grpc_service.py``) serves
``RemotePolicy`` (``remote.py``), the policy of ``jaxmesh.evaluate`` on
host-stepped envs: the server keeps each client lane's episode state in slots
of pools that run the host loop's own agent step (``agents.py``).

Needs the ``[serve]`` extra (websockets, msgpack, gRPC).
"""

try:
    import grpc  # noqa: F401 - the address checks are the served envs'
    import msgpack  # noqa: F401
    import websockets  # noqa: F401
except ImportError as e:
    raise ImportError(
        f"serving a policy needs the [serve] extra ({e.name} is not installed); "
        "run: pip install 'jaxmesh[serve]'"
    ) from e

from jaxmesh.serve.server import PolicyServer  # noqa: E402

__all__ = ["PolicyServer"]
