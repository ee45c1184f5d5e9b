"""``jaxmesh.evaluate`` over served envs (docs/remote.md): ``pool.py`` the
servers and lanes, ``pace.py`` the run, ``traffic.py`` its calls, replies and
lost servers."""

from jaxmesh.run.host.served.pace import ServedRun, ServedStepRun
from jaxmesh.run.host.served.pool import ServedLanes, default_lane_groups

__all__ = ["ServedLanes", "ServedRun", "ServedStepRun", "default_lane_groups"]
