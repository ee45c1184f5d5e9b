"""Gymnasium envs as host-stepped lanes: an ``Env``, a list of them, a ``VectorEnv``.

Every gymnasium call is here: ``lanes`` (JAX-free, shared with the env server),
``spec`` (the agent side's view), ``local`` (the host loop's) and ``workers``.
"""

from jaxmesh.envs.gymnasium.lanes import (
    PREFIX,
    TRIAL_INDEX,
    LaneError,
    ResultBatch,
    env_actions,
    import_gymnasium,
    info_value,
    is_host_stepped,
    mark_where,
    where_raised,
)
from jaxmesh.envs.gymnasium.local import (
    EnvLanes,
    LocalAdapter,
    VectorEnvLanes,
    WorkerEnvLanes,
    make_lanes,
)
from jaxmesh.envs.gymnasium.spec import (
    HostEnvSpec,
    action_layout,
    observation_layout,
)

__all__ = [
    "PREFIX",
    "TRIAL_INDEX",
    "is_host_stepped",
    "make_lanes",
    "EnvLanes",
    "LocalAdapter",
    "VectorEnvLanes",
    "WorkerEnvLanes",
    "HostEnvSpec",
    "LaneError",
    "ResultBatch",
    "observation_layout",
    "action_layout",
    "env_actions",
    "info_value",
    "import_gymnasium",
    "mark_where",
    "where_raised",
]
