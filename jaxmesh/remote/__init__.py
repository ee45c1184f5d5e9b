"""The gRPC boundary for served environments (host side only, no JAX here).

``proto/`` holds the versioned wire protocol (``jaxmesh.env.v1``) and its
generated code; ``codec`` turns arrays and leaves into its messages and back.
Needs the ``[remote]`` extra: ``pip install 'jaxmesh[remote]'``.
"""
