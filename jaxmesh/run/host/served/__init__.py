"""``jaxmesh.evaluate`` over served envs: ``"grpc://host:port"`` or a list of them.

The agent side is the host loop's jitted step (``host.HostAgent``: the same code
as the scan, CONTRACT 17); the env step becomes calls to env servers
(``jaxmesh.EnvServer``, ``jaxmesh serve-env``). Lanes move at their own pace,
and the actions known ahead of time (the rest of a chunk, under a lead the
prefetched one too) go to the server in segments that it replays
(docs/remote.md, "Evaluating against served envs").

Its modules, each named by what it holds: ``pool.py`` (``ServedLanes``: the
servers, their sessions, lane groups, reconnects), ``pace.py`` (the run:
``ServedRun`` and its loop, ``ServedStepRun``), and the parts the run holds:
``calls.py`` (``Outbox``: the outgoing queue and calls), ``replies.py``
(``Inbox``: taking and filing replies), ``loss.py`` (``ServerLoss``: losing
and rejoining servers) and ``segments.py`` (segment planning).
"""

from jaxmesh.run.host.served.pace import (
    ServedRun,
    ServedStepRun,
    needs_every_observation,
)
from jaxmesh.run.host.served.pool import (
    GROUPS_FROM_LANES,
    ServedLanes,
    default_lane_groups,
)

__all__ = [
    "ServedLanes",
    "ServedRun",
    "ServedStepRun",
    "needs_every_observation",
    "default_lane_groups",
    "GROUPS_FROM_LANES",
]
