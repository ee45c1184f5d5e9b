"""Gymnasium envs as host-stepped lanes: an ``Env``, a list of them, a ``VectorEnv``.

jaxmesh's host loops own episode accounting; this package owns every gymnasium
call. Three modules:

- ``lanes``: the lanes themselves, JAX-free (numpy and gymnasium only), shared
  by the in-process host loop and the env server (``jaxmesh.remote.server``):
  reset, step, replay a known run of actions, info rows, observation checks,
  ``VectorEnv`` lanes in lockstep (see its docstring).
- ``spec``: the agent side's view: ``HostEnvSpec`` (jaxmesh's env protocol,
  shapes only) and the observation and action layouts in JAX's dtypes.
- ``local``: the in-process host loop's adapters over the shared lanes:
  ``EnvLanes`` and ``VectorEnvLanes`` (both ``LocalAdapter``), ``WorkerEnvLanes``
  (lanes in worker processes) and ``make_lanes``.

gymnasium is imported on first use, so importing this package costs nothing.
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
