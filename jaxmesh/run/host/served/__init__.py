"""``jaxmesh.evaluate`` over served envs: ``"grpc://host:port"`` or a list of them.

The agent side is the host loop's jitted step (``host.HostAgent``: the same code
as the scan, CONTRACT 17); this module replaces the env step with calls to one
or more env servers (``jaxmesh.EnvServer``, ``jaxmesh serve-env``).

Lanes move at their own pace. A lane takes an agent step as soon as the result of
its previous action (or its reset observation) is in; a lane still waiting for
its server keeps its whole agent state (``host_step``'s ``moved`` mask). The
actions a lane will execute are known ahead of time up to the end of its chunk
(and, under a prefetch lead, of the prefetched chunk), so they go to the server
in **segments** that the server replays, stopping at the episode's end:

- without a lead, a chunk of h actions is one segment: one round trip per plan;
- with a lead L, a chunk is cut at ``h - L``: the head's reply carries the
  observation the prefetch plan reads, and the tail, sent in the next message
  of the same flush, runs on the server while the client plans; the next chunk
  goes out as soon as it is planned, so the server never waits for it.

Messages are flushed when no lane can move (the loop would otherwise wait), one
message per segment rank on each server; a server replies in order. With
several servers or lane groups, reader threads decode replies while the loop
plans; with one of each the loop has nothing to do while it waits, so it takes
each reply off the stream itself (a thread hand-off less). Actions sent after an
episode's end execute nothing (the server's rule), and their replies are
dropped by episode epoch. An action that would fail the run's checks (out of
range, not finite) is never sent: the segment stops before it, and the run
raises ``BadValueError`` at the step that meets it, as in process.

Only the observation leaves the policy reads cross the wire (a Dict or Tuple
observation's leaves, CONTRACT 31: the server is asked for those, and those an
episode recording keeps; one array is the one leaf), every replayed step's when
an observation window reads more than one frame (or an episode is recorded),
else the last of each segment (the frames in between are never read; CONTRACT
19).
The info values asked for (metrics, the success key) cross on those rows, or on
every replayed step's row when a reduction reads every step (success once, a
mean, ...): the server sends them (``info_every_step``) without the observations
in between; a server that does not declare it sends every observation instead.

With ``lane_groups`` G > 1 the lanes form G contiguous groups that take agent
steps in turn, and a group's messages go as soon as none of its lanes can move,
so the device plans for one group while a server steps another. A server over a
``VectorEnv`` says ``lockstep``: it steps every lane at once, so the client sends
one call at a time with each lane's next segment cut to the shortest, and
releases a lane it abandons at ``max_episode_steps`` with nothing left to run.

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
    wire_leaves,
)
from jaxmesh.run.host.served.pool import (
    GROUPS_FROM_LANES,
    ServedLanes,
    default_lane_groups,
)

__all__ = [
    "ServedLanes",
    "wire_leaves",
    "ServedRun",
    "ServedStepRun",
    "needs_every_observation",
    "default_lane_groups",
    "GROUPS_FROM_LANES",
]
