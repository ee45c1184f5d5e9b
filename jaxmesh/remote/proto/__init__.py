"""The ``jaxmesh.env.v1`` wire protocol: ``jaxmesh_env.proto`` and the code that
grpcio-tools' protoc generates from it (checked in; regenerate with
``make proto``)."""
