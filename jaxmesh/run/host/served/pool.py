"""The served lanes: ``ServedLanes``, one session on each env server."""

from __future__ import annotations

from typing import Any

from jaxmesh.envs.gymnasium.spec import spec_for
from jaxmesh.errors import RemoteError
from jaxmesh.remote import codec, spaces
from jaxmesh.remote.session import Session
from jaxmesh.run import backend

#: Lanes from which a served run splits its lanes in two groups by default.
GROUPS_FROM_LANES = 8
#: Seconds a session waits for its server at the run's start.
CONNECT_SECONDS = 10.0


def default_lane_groups(num_lanes: int) -> int:
    """Lane groups when the caller gives none (docs/remote.md)."""
    return 2 if num_lanes >= GROUPS_FROM_LANES else 1


class ServedLanes:
    """Lanes dealt round-robin over env servers, one session each: lane j is
    lane ``local[j]`` of server ``server[j]``; ``reply_timeout="auto"`` drops a
    hung server when others are left and ``on_server_loss="rerun"``.
    RemoteConnectionError for a server out of reach, TypeError for other spaces."""

    def __init__(
        self,
        addresses: list[str],
        num_envs: int,
        *,
        token: str | None = None,
        reply_timeout: float | str | None = None,
        credentials: Any = None,
        on_server_loss: str = "rerun",
        transport: str = "auto",
    ):
        self.on_server_loss = on_server_loss
        self.addresses = list(addresses)
        self.where = f"{len(addresses)} env server{'s' * (len(addresses) > 1)}"
        self.auto_timeout = (
            reply_timeout == backend.AUTO
            and len(self.addresses) > 1
            and on_server_loss == "rerun"
        )
        if reply_timeout == backend.AUTO:
            reply_timeout = None
        self.reply_timeout = reply_timeout  # every session's
        self._connect = {
            "token": token,
            "connect_timeout": CONNECT_SECONDS,
            "reply_timeout": reply_timeout,
            "credentials": credentials,
            "transport": transport,
        }
        self.sessions: list[Session] = []
        try:
            for a in addresses:
                self.sessions.append(Session(a, **self._connect))
        except BaseException:
            self.close()
            raise
        first = self.sessions[0].info
        for c in self.sessions[1:]:
            for field in ("observation", "action"):
                if getattr(c.info, field) != getattr(first, field):
                    self.close()
                    raise TypeError(
                        f"the server at {c.address} declares the {field} space "
                        f"{getattr(c.info, field)}, the one at {first.address} "
                        f"{getattr(first, field)}; every server of a run must serve "
                        "the same env"
                    )
        try:
            self.observation_space = spaces.observation_space(first.observation)
            self.action_space = spaces.leaf_space(first.action)
        except codec.ProtocolError as exc:
            self.close()
            raise RemoteError(
                f"the jaxmesh env server at {first.address} declared spaces this "
                f"client cannot rebuild: {exc}; upgrade the older side",
                address=first.address,
            ) from None
        where = f"served env at {first.address}"
        self.spec = spec_for(
            first.env_name, self.observation_space, self.action_space, where, first.dt
        )
        # Round-robin: lane k of every server, k ascending.
        dealt = sorted(
            (k, s) for s, c in enumerate(self.sessions) for k in range(c.info.num_lanes)
        )[:num_envs]
        self.local = [k for k, _ in dealt]
        self.server = [s for _, s in dealt]
        self.num_lanes = len(self.server)
        self.lane_groups = 1  # set by ``group``

    @classmethod
    def of(cls, env: Any, num_envs: int, _episodes: int, _workers: int, served: Any):
        """The lanes of a served run (``dispatch.Route.lanes``)."""
        return cls(
            [env] if isinstance(env, str) else list(env),
            num_envs,
            token=served.token,
            credentials=served.credentials,
            reply_timeout=served.reply_timeout,
            on_server_loss=served.on_server_loss or "rerun",
            transport=served.transport or "auto",
        )

    def group(self, settings: Any, lane_groups: int | None) -> int | None:
        """Sets the run's lane groups (one for a lockstep server); returns the
        lanes the default plan tile is sized for (None: all)."""
        n = min(settings.num_envs, self.num_lanes)
        asked = lane_groups is not None
        groups = lane_groups if asked else default_lane_groups(n)
        if any(c.lockstep for c in self.sessions):
            groups = 1
        self.lane_groups = max(1, min(groups, n))
        # Default groups keep the tile of all N lanes, so that a run's results
        # are those of one group bit for bit (a tile's size can change a row's
        # rounding); asked-for groups plan in a tile sized for one group.
        if self.lane_groups > 1 and asked and settings.plan_tile is None:
            return -(-n // self.lane_groups)
        return None

    def reconnect(self, s: int, connect_timeout: float) -> Session:
        """A new session with server ``s``, serving what the lost one did."""
        kw = {**self._connect, "connect_timeout": connect_timeout}
        session = Session(self.addresses[s], **kw)
        old, new = self.sessions[s].info, session.info
        used = sum(1 for x in self.server if x == s)
        same = all(
            getattr(new, f) == getattr(old, f) for f in ("observation", "action")
        ) and (session.info_every_step or not self.sessions[s].info_every_step)
        if not same or new.num_lanes < used:
            session.close()
            raise ValueError(
                f"the server back at {self.addresses[s]} serves other spaces, "
                f"fewer than {used} lanes or an older protocol; it is not rejoined"
            )
        return session

    def close(self) -> None:
        for c in self.sessions:
            c.close()
