"""A call checked before anything is stepped: a ``StepRequest`` or a same-host
STEP frame as a ``lanes._Request``, else a ``ProtocolError`` naming the fault.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from jaxmesh.envs.gymnasium import lanes as shared
from jaxmesh.remote import codec
from jaxmesh.remote import shm as same_host
from jaxmesh.remote.proto import jaxmesh_env_pb2 as pb
from jaxmesh.remote.protocol import MAX_COUNT
from jaxmesh.remote.server.lanes import ServerStepper, _Request

_bad = codec.ProtocolError


def _parse_request(msg: pb.StepRequest, lanes: ServerStepper) -> _Request:
    n = lanes.num_lanes
    if len(msg.lane_mask) != n:
        raise _bad(
            f"lane_mask has {len(msg.lane_mask)} entries, expected {n} (one per "
            "server lane, as the handshake's num_lanes says)"
        )
    mask = msg.lane_mask
    # Lengths first: repeated fields longer than any request needs.
    _check_keys("observation keys", msg.observation_keys)
    _check_keys("info keys", msg.info_keys)
    if len(msg.release) > n:
        raise _bad(
            f"release names {len(msg.release)} lanes, but the server has {n} lanes; "
            "name each lane at most once"
        )
    if len(msg.resets) > n:
        raise _bad(
            f"resets has {len(msg.resets)} entries, but the server has {n} lanes; "
            "reset each lane at most once"
        )

    def check_lane(lane: int, what: str) -> None:
        if lane >= n:
            raise _bad(
                f"{what} names lane {lane}, but the server has {n} lanes (0..{n - 1})"
            )
        if not mask[lane]:
            raise _bad(f"{what} names lane {lane}, which is not set in lane_mask")

    ops: dict[int, Any] = {}
    single = None
    for r in msg.resets:
        lane = int(r.lane)
        check_lane(lane, "resets")
        if lane in ops:
            raise _bad(f"resets names lane {lane} more than once")
        if r.seed < 0:
            raise _bad(f"resets: lane {lane} has seed {r.seed}; expected a seed >= 0")
        mes = r.max_episode_seconds
        if not (math.isfinite(mes) and mes >= 0):
            raise _bad(
                f"resets: lane {lane} has max_episode_seconds {mes}; expected a "
                "finite number >= 0 (0: no wall-clock cap)"
            )
        options: dict[str, Any] = {}
        for name, value in r.options.items():
            if name not in lanes.reset_options:
                raise _bad(
                    f"resets: lane {lane} has reset option {name[:64]!r}, but the "
                    f"env declares {list(lanes.reset_options)} (see the handshake's "
                    "reset_options)"
                )
            if value.WhichOneof("kind") != "int_value":
                raise _bad(
                    f"resets: lane {lane} has reset option {name!r} of kind "
                    f"{value.WhichOneof('kind')}; expected int_value"
                )
            options[name] = int(value.int_value)
        ops[lane] = shared.Reset(lane, int(r.seed), options or None, float(mes))
    if msg.HasField("batch"):
        batch = codec.decode_action_batch(
            msg.batch, {"": lanes.act_spec}, num_lanes=n, max_count=MAX_COUNT
        )
        arr, stepped = _check_actions(batch, lanes, mask, ops, check_lane)
        if not ops and not msg.release and np.all(batch.counts == 1):
            single = (stepped, arr)  # one action per lane, nothing else
        else:
            ops.update((op.lane, op) for op in _replays(batch, arr))
    keys = set(msg.observation_keys)
    names = lanes.obs_names
    if not keys <= set(names):
        unknown = sorted(keys - set(names))
        has = (
            "the observation has the single leaf ''"
            if names == ("",)
            else f"the observation has the leaves {codec.few(names)}"
        )
        raise _bad(
            f"observation_keys {codec.few(unknown)} are not all declared: {has} "
            "(see the handshake)"
        )
    release = tuple(dict.fromkeys(int(j) for j in msg.release))
    for lane in release:
        check_lane(lane, "release")
        if lane in ops:
            raise _bad(
                f"lane {lane} is both released and reset or stepped in one call; "
                "release a lane only when it takes no other part in the call"
            )
    request = _Request(
        built=None if single is not None else [ops[j] for j in sorted(ops)],
        want_obs=bool(keys),
        info_keys=tuple(dict.fromkeys(msg.info_keys)),
        all_observations=bool(msg.all_observations),
        call_id=int(msg.call_id),
        release=release,
        single=single,
        info_every_step=bool(msg.info_every_step),
        obs_keys=_obs_keys(names, keys),
    )
    lanes.check(request)
    return request


def _check_actions(
    batch: codec.ActionBatch, lanes: ServerStepper, mask, ops, check_lane
):
    """A batch's actions (a writable copy) and lanes, checked: discrete actions
    in range, each lane in ``mask``, reset before and not in ``ops``."""
    arr = np.array(batch.actions[""])
    if lanes.discrete and arr.size:
        low = lanes.act_leaf.start
        high = low + lanes.act_leaf.n
        if arr.min() < low or arr.max() >= high:
            bad = arr[(arr < low) | (arr >= high)][0]
            raise _bad(
                f"the action batch has action {int(bad)}, outside the env's "
                f"Discrete({lanes.act_leaf.n}, start={low}) [{low}, {high - 1}]"
            )
    stepped = batch.lanes  # ascending and < n (decode_action_batch)
    bad = ~np.asarray(mask, bool)[stepped] | ~lanes.lanes.started[stepped]
    if ops:
        bad |= np.isin(stepped, list(ops))
    for lane in stepped[bad].tolist()[:1]:  # the first lane at fault, named
        check_lane(lane, "the action batch")
        if lane in ops:
            raise _bad(
                f"lane {lane} is both reset and stepped in one call; reset it "
                "in one call and step it in the next"
            )
        raise _bad(
            f"the action batch steps lane {lane}, which was never reset in "
            f"this session; reset lane {lane} first"
        )
    return arr, stepped


def _parse_step(
    payload: bytes, lanes: ServerStepper, keys: tuple[str, ...]
) -> _Request:
    n = lanes.num_lanes
    call_id, flags, info, batch = same_host.unpack_step(
        payload, lanes.act_spec, num_lanes=n, max_count=MAX_COUNT
    )
    mask = np.zeros(n, bool)
    mask[batch.lanes] = True
    # Every lane named is in range and in the mask: no lane check.
    arr, stepped = _check_actions(batch, lanes, mask, {}, lambda *_: None)
    single = (stepped, arr) if np.all(batch.counts == 1) else None
    request = _Request(
        built=None if single is not None else _replays(batch, arr),
        want_obs=bool(keys),
        info_keys=_info_keys(info),
        all_observations=bool(flags & same_host.ALL_OBSERVATIONS),
        call_id=call_id,
        single=single,
        info_every_step=bool(flags & same_host.INFO_EVERY_STEP),
        obs_keys=_obs_keys(lanes.obs_names, keys),
    )
    lanes.check(request)
    return request


def _replays(batch: codec.ActionBatch, arr: np.ndarray) -> list[shared.Replay]:
    return [
        shared.Replay(lane, arr[start : start + count])
        for lane, start, count in zip(
            batch.lanes.tolist(),
            batch.offsets.tolist(),
            batch.counts.tolist(),
            strict=True,
        )
    ]


def _obs_keys(names: tuple[str, ...], keys: Any) -> tuple[str, ...] | None:
    return None if len(keys) == len(names) else tuple(n for n in names if n in keys)


@functools.lru_cache(maxsize=64)
def _info_keys(data: bytes) -> tuple[str, ...]:
    """A STEP frame's info keys, checked (cached: the same bytes each call)."""
    try:
        keys = data.decode("utf-8").split("\0") if data else []
    except UnicodeDecodeError:
        raise _bad("the step frame's info keys are not UTF-8") from None
    _check_keys("info keys", keys)
    return tuple(dict.fromkeys(keys))


def _check_keys(what: str, field: Any) -> None:
    if len(field) > codec.MAX_KEYS:
        raise _bad(
            f"the request asks for {len(field)} {what}, more than the "
            f"{codec.MAX_KEYS} a request may name (the first: "
            f"{codec.few(field[: codec.FEW + 1], len(field))})"
        )
    for key in field:
        if len(key) > codec.MAX_KEY_CHARS:
            raise _bad(
                f"the request names the {what[:-1]} {codec.short(key)}, longer "
                f"than the {codec.MAX_KEY_CHARS} characters a key may have"
            )
