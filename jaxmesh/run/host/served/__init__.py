"""``jaxmesh.evaluate`` over served envs (``"grpc://host:port"`` or a list):
the host loop's agent step, the env step as calls to env servers, each lane at
its own pace, known actions sent ahead in segments (docs/remote.md,
"Evaluating against served envs"). ``pool.py``: the servers and lanes;
``pace.py``: the run; ``calls.py``, ``replies.py``, ``loss.py``,
``segments.py``: its outgoing calls, replies, lost servers and segments.
"""

from jaxmesh.run.host.served.pace import ServedRun, ServedStepRun
from jaxmesh.run.host.served.pool import ServedLanes, default_lane_groups

__all__ = ["ServedLanes", "ServedRun", "ServedStepRun", "default_lane_groups"]
