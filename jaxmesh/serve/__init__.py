"""Serving a policy: one jitted model behind many clients, batched, over
openpi's websocket protocol or jaxmesh's own over gRPC (``PolicyServer``).
Needs the ``[serve]`` extra; docs/serving.md.
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
