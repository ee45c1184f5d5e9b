"""Every step's info with the last observation only (``info_every_step``).

A served chunk sends one observation per segment back; the info values that a
reduction reads at every step (success once, a mean) come back for every step
all the same. Checked against plain loops over the env's own reset and step:
at the wire (``Session``), and through ``evaluate`` on a server that declares
the capability and on one that does not (it is asked for every observation).
"""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import ID, SEEDS, check, chunky, plain_loop
from gymnasium import spaces

import jaxmesh
from jaxmesh.remote.protocol import INFO_EVERY_STEP
from jaxmesh.remote.server import EnvServer
from jaxmesh.remote.server import same_host as same_host_mod
from jaxmesh.remote.server import service as service_mod
from jaxmesh.remote.session import Session

CHUNK = 5
KEYS = ("is_success", "t")


class Blink(gym.Env):
    """Success at step 3 only (inside a chunk of 5); ``info["t"]`` is the step
    times (1 + action); the reward is the action; 4 + seed % 4 steps."""

    observation_space = spaces.Box(-100.0, 100.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def _obs(self):
        return np.array([self.t, self.length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, 4 + seed % 4
        return self._obs(), {"is_success": False, "t": 0.0}

    def step(self, action):
        self.t += 1
        info = {"is_success": self.t == 3, "t": float(self.t * (1 + action))}
        return self._obs(), float(action), self.t >= self.length, False, info


def blink_policy(obs):
    """A chunk of 5 that depends on the step it is planned at (obs[0]): a
    stale observation changes the actions."""
    return ((obs[0] + obs[1] + jnp.arange(CHUNK)) % 2).astype(jnp.int32)


def blink_loop(seeds):
    """Per seed, by hand: (return, length, success once, at end, mean of t)."""
    env, out = Blink(), []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        flags, ts, rewards, done = [], [], [], False
        while not done:
            chunk = np.asarray(blink_policy(jnp.asarray(obs)))
            for a in chunk.tolist():
                obs, r, term, trunc, info = env.step(a)
                rewards.append(r)
                flags.append(info["is_success"])
                ts.append(info["t"])
                done = term or trunc
                if done:
                    break
        out.append((sum(rewards), len(rewards), any(flags), flags[-1], np.mean(ts)))
    return out


# At the wire ------------------------------------------------------------------------
def test_a_replay_sends_every_steps_info_and_its_last_observation():
    # Reference: the same actions on a plain env, every step's obs and info.
    ref = {}
    for lane, seed in ((0, 1), (1, 2)):
        env = Blink()
        obs, info = env.reset(seed=seed)
        steps = [(obs, info)]
        for a in [1, 0, 1, 1, 0, 1, 0, 0, 1][: env.length]:
            obs, _, _, _, info = env.step(a)
            steps.append((obs, info))
        ref[lane] = steps
    actions = np.asarray([1, 0, 1, 1, 0, 1, 0, 0, 1], np.int64)
    with EnvServer([Blink(), Blink()], "127.0.0.1:0") as server:
        session = Session(f"grpc://{server.address}")
        assert session.info_every_step
        session.open(reader=False)

        def call(**kw):
            session.send(info_keys=KEYS, info_every_step=True, **kw)
            return session.receive().batch

        b = call(reset_lanes=[0, 1], seeds=[1, 2])
        assert b.rows.tolist() == [1, 1] and b.info_rows is None
        # Lane 0 replays 5 actions (its whole episode), lane 1 two.
        b = call(
            lanes=np.array([0, 1]),
            counts=[5, 2],
            actions=actions[[0, 1, 2, 3, 4, 0, 1]],
        )
        assert b.steps.tolist() == [5, 2] and b.rows.tolist() == [1, 1]
        assert b.info_rows.tolist() == [5, 2]
        np.testing.assert_array_equal(b.observation[""], [ref[0][5][0], ref[1][2][0]])
        want = [ref[0][t][1] for t in range(1, 6)] + [ref[1][t][1] for t in (1, 2)]
        for key in KEYS:
            assert b.info[key].tolist() == [w[key] for w in want]
        # A reset (one row) and a replay (one per step) in one call; lane 1's
        # episode ends after 4 of its 5 actions.
        b = call(
            reset_lanes=[0],
            seeds=[3],
            lanes=np.array([1]),
            counts=[5],
            actions=actions[2:7],
        )
        assert b.steps.tolist() == [0, 4] and b.rows.tolist() == [1, 1]
        assert b.info_rows.tolist() == [1, 4]
        np.testing.assert_array_equal(b.observation[""][1], ref[1][6][0])
        assert b.info["t"].tolist() == [0.0] + [ref[1][t][1]["t"] for t in range(3, 7)]
        # After its end a lane executes nothing: no row at all.
        b = call(lanes=np.array([1]), counts=[2], actions=actions[:2])
        assert b.steps.tolist() == [0] and b.rows.tolist() == [0]
        assert b.info == {} and b.info_rows is None
        session.close()


# Through evaluate -------------------------------------------------------------------
@pytest.mark.parametrize("declared", [True, False])
def test_served_success_once_and_a_mean_match_the_plain_loop(declared, monkeypatch):
    if not declared:  # a server from before the field: it neither says nor reads it
        older = tuple(c for c in service_mod.CAPABILITIES if c != INFO_EVERY_STEP)
        monkeypatch.setattr(service_mod, "CAPABILITIES", older)
        parse = service_mod._parse_request

        def unread(msg, lanes):
            msg.ClearField("info_every_step")
            return parse(msg, lanes)

        # Both transports parse a request: the gRPC stream and the same-host path.
        monkeypatch.setattr(service_mod, "_parse_request", unread)
        monkeypatch.setattr(same_host_mod, "_parse_request", unread)
    seeds = list(range(8))
    with EnvServer([Blink() for _ in range(3)], "127.0.0.1:0") as server:
        with Session(f"grpc://{server.address}") as session:
            assert session.info_every_step == declared
        result = jaxmesh.evaluate(
            blink_policy,
            f"grpc://{server.address}",
            num_envs=3,
            horizon=CHUNK,
            seeds=seeds,
            scoring=jaxmesh.Scoring(metrics={"t": "mean"}),
        )
    want = blink_loop(seeds)
    ret, length, once, end, mean_t = (list(x) for x in zip(*want, strict=True))
    assert result.returns.tolist() == ret
    assert result.lengths.tolist() == length
    assert result.success_key == "is_success"
    assert result.success_once.tolist() == once
    assert result.success_at_end.tolist() == end
    np.testing.assert_allclose(result.metrics["t"], mean_t, rtol=1e-6)  # float32
    assert any(once) and not any(end)  # step 3 is inside the first chunk


def test_tracking_success_on_an_env_without_the_key_sends_no_more():
    # CartPole has no success key: the default (success=None) looks for one at
    # every step, yet its replies are the bytes of a run that looks for none.
    fn = jax.jit(chunky)
    refs = plain_loop(gym.make(ID), lambda x, k: fn(x), SEEDS, horizon=6)
    runs = {}
    with EnvServer([gym.make(ID) for _ in range(3)], "127.0.0.1:0") as server:
        for success in (None, False):
            runs[success] = jaxmesh.evaluate(
                chunky,
                f"grpc://{server.address}",
                num_envs=3,
                horizon=6,
                seeds=SEEDS,
                scoring=jaxmesh.Scoring(success=success),
            )
    for result in runs.values():
        check(result, refs, 3)

    def total(result, key):
        s = result.telemetry[key]
        return s["mean"] * s["count"]

    assert runs[None].success_once is None  # no signal: unknown, never False
    assert total(runs[None], "reply_bytes") == total(runs[False], "reply_bytes")
