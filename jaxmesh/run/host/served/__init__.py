"""``jaxmesh.evaluate`` over served envs (docs/remote.md): ``pace.py`` the run,
``traffic.py`` its servers and lanes, calls, replies and lost servers."""

from jaxmesh.run.host.served.pace import ServedRun, ServedStepRun
from jaxmesh.run.host.served.traffic import ServedLanes, default_lane_groups

__all__ = ["ServedLanes", "ServedRun", "ServedStepRun", "default_lane_groups"]
