"""The gRPC boundary for served envs (no JAX; docs/remote.md). ``proto/`` holds
the wire protocol and its generated code. Needs the ``[remote]`` extra.
"""
