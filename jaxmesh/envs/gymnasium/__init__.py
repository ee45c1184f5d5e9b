"""Gymnasium envs as host-stepped lanes: an ``Env``, a list of them, a ``VectorEnv``.

jaxmesh's host loops own episode accounting; this package owns every gymnasium
call. Three modules:

- ``lanes``: the lanes themselves, JAX-free (numpy and gymnasium only), shared
  by the in-process host loop and the env server (``jaxmesh.remote.server``):
  reset, step, replay a known run of actions, info rows, observation checks,
  ``VectorEnv`` lanes in lockstep (see its docstring).
- ``spec``: the agent side's view: ``HostEnvSpec`` (jaxmesh's env protocol,
  shapes only) and the observation and action layouts in JAX's dtypes.
- ``local``: the in-process host loop's adapters (``EnvLanes``,
  ``VectorLanes``, ``make_lanes``) over the shared lanes.

gymnasium is imported on first use, so importing this package costs nothing.
"""

from jaxmesh.envs.gymnasium import lanes as _shared
from jaxmesh.envs.gymnasium import local as _local
from jaxmesh.envs.gymnasium import spec as _spec
from jaxmesh.envs.gymnasium.lanes import (
    DISABLED_HOW,
    PREFIX,
    TRIAL_INDEX,
    LaneError,
    ResultBatch,
    env_actions,
    info_value,
    is_host_stepped,
    mark_where,
    where_raised,
)
from jaxmesh.envs.gymnasium.local import (
    EnvLanes,
    VectorLanes,
    WorkerEnvLanes,
    make_lanes,
)
from jaxmesh.envs.gymnasium.spec import (
    HostEnvSpec,
    action_layout,
    observation_layout,
)

# Private names that other modules (and branches) reach for by their names in
# the former single module ``jaxmesh.envs.gymnasium``.
_gym = _shared._gym
_declares_trial_index = _shared.declares_trial_index
_env_name = _shared.env_name
_idle_action = _shared.idle_action
_same_space = _shared.same_space
_Lanes = _local._Lanes
_spec_for = _spec.spec_for
_canonical = _spec._canonical
_DISABLED_HOW = DISABLED_HOW

__all__ = [
    "PREFIX",
    "TRIAL_INDEX",
    "is_host_stepped",
    "make_lanes",
    "EnvLanes",
    "VectorLanes",
    "WorkerEnvLanes",
    "HostEnvSpec",
    "LaneError",
    "ResultBatch",
    "observation_layout",
    "action_layout",
    "env_actions",
    "info_value",
    "mark_where",
    "where_raised",
]
