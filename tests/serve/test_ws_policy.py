"""``jaxmesh.RemotePolicy("ws://...")`` against a websocket server written
here with ``openpi_client.msgpack_numpy`` (a known numpy policy that misbehaves
on demand) and against ``jaxmesh serve-policy``, whose replies must equal
openpi's own ``WebsocketClientPolicy``'s."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import time

import gymnasium as gym
import numpy as np
import pytest
import tqdm
from openpi_client import image_tools, msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from serve_models import linear_model, linear_reference
from websockets.asyncio.server import serve
from ws_servers import ThreadedServer

import jaxmesh
from jaxmesh.cli import main
from jaxmesh.errors import HostPolicyError
from jaxmesh.serve import remote
from jaxmesh.serve.libero_inputs import (
    libero_inputs,
    quat_to_axis_angle,
    resize_with_pad,
)
from jaxmesh.serve.ws_client import (
    RemotePolicyError,
    WebsocketPolicy,
    decode_prompt,
    encode_prompt,
)

K = 4
STATE = "observation/state"


def chunk_of(state: np.ndarray) -> np.ndarray:
    """The test server's policy: ``serve_models.linear_reference`` ([4, 2])."""
    return linear_reference(np.asarray(state, np.float32))


def cartpole_chunk(obs: np.ndarray) -> np.ndarray:
    """A wobbly CartPole chunk of 4 discrete actions (episodes of different
    lengths)."""
    a = int(obs[2] > 0)
    return np.array([a, a, 1 - a, a], np.int32)


class Server(ThreadedServer):
    """openpi's protocol on 127.0.0.1 (a free port), in a thread: replies with
    ``policy(obs["observation/state"])``; ``mode`` makes it misbehave."""

    def __init__(self, policy=chunk_of, metadata=None, token=None, reads=STATE):
        super().__init__()
        self.policy, self.reads = policy, reads
        self.metadata = {"action_horizon": K} if metadata is None else metadata
        self.token = token
        self.mode = "ok"  # or: close, error, no_actions, wrong_shape, hang
        self.fail_after: int | None = None  # then mode "error"
        self.requests: list[dict] = []
        self.inflight = self.most_inflight = 0
        self.delay = 0.0

    @property
    def address(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

        def check(connection, request):
            if self.token and request.headers.get("Authorization") != (
                f"Api-Key {self.token}"
            ):
                return connection.respond(401, "bad token\n")
            return None

        async with serve(
            self._handle, "127.0.0.1", 0, compression=None, process_request=check
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _handle(self, ws) -> None:
        await ws.send(msgpack_numpy.packb(self.metadata))
        async for message in ws:
            obs = msgpack_numpy.unpackb(message)
            self.requests.append(obs)
            self.inflight += 1
            self.most_inflight = max(self.most_inflight, self.inflight)
            try:
                await asyncio.sleep(self.delay)
                if self.fail_after is not None and len(self.requests) > self.fail_after:
                    self.mode = "error"
                if self.mode == "close":
                    await ws.close()
                    return
                if self.mode == "error":
                    await ws.send("Traceback: the model raised ValueError('boom')")
                    await ws.close(code=1011)
                    return
                if self.mode == "hang":  # until the client gives up
                    await ws.wait_closed()
                    return
                x = obs if self.reads is None else obs[self.reads]
                reply = {"actions": self.policy(x)}
                if self.mode == "no_actions":
                    reply = {"server_timing": {"infer_ms": 1.0}}
                if self.mode == "wrong_shape":
                    reply["actions"] = reply["actions"][:2]
                await ws.send(msgpack_numpy.packb(reply))
            finally:
                self.inflight -= 1


def states(b: int) -> np.ndarray:
    return np.arange(b * 3, dtype=np.float32).reshape(b, 3) / 7.0


# The client on its own ----------------------------------------------------------------
def test_rows_go_as_concurrent_requests_and_their_chunks_stack_in_order():
    with Server() as server:
        server.delay = 0.2  # so that the rows' requests overlap on the server
        with WebsocketPolicy(server.address, connections=8) as policy:
            assert policy.native_chunk == K  # the metadata's action_horizon
            obs = states(6)
            got = policy._plan(obs)
            assert got.shape == (6, K, 2)
            for i in range(6):
                np.testing.assert_allclose(got[i], chunk_of(obs[i]), rtol=1e-6)
            assert len(server.requests) == 6 == policy.client.requests
            assert server.most_inflight == 6
            # The rows' requests, each under openpi's state key, no prompt.
            sent = sorted(float(r["observation/state"][0]) for r in server.requests)
            np.testing.assert_allclose(sent, sorted(obs[:, 0]))
            assert all(set(r) == {"observation/state"} for r in server.requests)
            # A bounded pool: at most `connections` requests at once.
            server.requests.clear()
            server.most_inflight = 0
        with WebsocketPolicy(server.address, connections=2) as policy:
            got = policy._plan(states(5))
            np.testing.assert_allclose(got[4], chunk_of(states(5)[4]), rtol=1e-6)
            assert server.most_inflight == 2 and len(server.requests) == 5


def test_inputs_build_each_request_from_a_row_and_its_instruction():
    seen = []

    def inputs(row, instruction):
        seen.append(instruction)
        return {"observation/state": row["pos"] * 2, "prompt": instruction}

    with Server() as server:
        with WebsocketPolicy(server.address, inputs, instructions=True) as policy:
            pos = states(2)
            obs = {"obs": {"pos": pos}, "prompt": np.stack([encode_prompt("go")] * 2)}
            got = policy._plan(obs)
            np.testing.assert_allclose(got[1], chunk_of(pos[1] * 2), rtol=1e-6)
            assert seen == ["go", "go"]
            assert [r["prompt"] for r in server.requests] == ["go", "go"]
        named = "jaxmesh.serve.libero_inputs:libero_inputs"  # as a config names it
        with WebsocketPolicy(server.address, named) as policy:
            assert policy.inputs is libero_inputs
    with pytest.raises(TypeError, match="inputs=3"):
        WebsocketPolicy(server.address, 3)
    assert decode_prompt(encode_prompt("put the bowl on the plate")) == (
        "put the bowl on the plate"
    )
    with pytest.raises(ValueError, match="at most 1024"):
        encode_prompt("x" * 1025)


def test_the_chunk_length_comes_from_native_chunk_without_metadata():
    with Server(metadata={}) as server:
        with WebsocketPolicy(server.address) as policy:
            assert policy.native_chunk is None  # one action per reply
        with WebsocketPolicy(server.address, native_chunk=K) as policy:
            assert policy._plan(states(1)).shape == (1, K, 2)


def test_a_token_travels_as_api_key():
    with Server(token="s3cret") as server:
        with pytest.raises(RemotePolicyError, match="HTTP 401.*token") as info:
            WebsocketPolicy(server.address)
        assert info.value.address == server.address
        with WebsocketPolicy(server.address, token="s3cret") as policy:
            assert policy._plan(states(1)).shape == (1, K, 2)


# Faults -------------------------------------------------------------------------------
def test_an_unreachable_server_fails_at_construction():
    with Server() as server:
        address = server.address
    with pytest.raises(RemotePolicyError, match="cannot be reached.*serve-policy"):
        WebsocketPolicy(address, connect_timeout=2)
    with pytest.raises(ValueError, match="ws://host:port"):
        WebsocketPolicy("http://127.0.0.1:1")


@pytest.mark.parametrize(
    "mode, match",
    [
        ("close", "closed the connection"),
        ("error", "failed the request:\nTraceback: the model raised ValueError"),
        ("no_actions", r"replied without 'actions' \(keys \['server_timing'\]\)"),
        ("wrong_shape", r"shape \(2, 2\).*expected \[4, ...\].*native_chunk="),
        ("hang", "did not answer a request within 0.5 s.*timeout="),
    ],
)
def test_a_server_fault_is_a_typed_error_naming_the_address(mode, match):
    with Server() as server:
        with WebsocketPolicy(server.address, timeout=0.5) as policy:
            server.mode = mode
            with pytest.raises(RemotePolicyError, match=match) as info:
                policy._plan(states(2))
            assert server.address in str(info.value)
            # The pool recovers: a broken connection is replaced.
            server.mode = "ok"
            np.testing.assert_allclose(
                policy._plan(states(1))[0], chunk_of(states(1)[0]), rtol=1e-6
            )


# Against jaxmesh's own server and openpi's client -------------------------------------
def test_replies_equal_openpis_own_client_against_serve_policy():
    obs = states(5)
    with jaxmesh.PolicyServer(
        linear_model(),
        max_batch=4,
        max_wait_ms=500,  # a forward waits for the rows sent with its first
        example={"observation/state": obs[0]},
    ) as server:
        host, port = server.address.rsplit(":", 1)
        reference = WebsocketClientPolicy(host, int(port))
        try:
            want = np.stack(
                [reference.infer({"observation/state": x})["actions"] for x in obs]
            )
        finally:
            reference._ws.close()
        with WebsocketPolicy(f"ws://{server.address}") as policy:
            assert policy.native_chunk == 4  # serve-policy's action_horizon
            # One row: the reference's program (a batch of one), bit for bit.
            np.testing.assert_array_equal(policy._plan(obs[:1]), want[:1])
            # Five rows, batched by the server: equal to float rounding.
            np.testing.assert_allclose(policy._plan(obs), want, rtol=1e-6, atol=1e-6)
            assert max(server.stats.batch_sizes) == 4  # the server batched them
    for x, chunk in zip(obs, want, strict=True):
        np.testing.assert_allclose(chunk, linear_reference(x), rtol=1e-5, atol=1e-6)


def test_a_plan_of_fewer_rows_never_waits_for_an_idle_connection():
    # serve-policy's batcher waits, up to max_wait_ms, for a request from every
    # connected client: the client leaves none idle through a plan.
    obs = states(4)
    with jaxmesh.PolicyServer(
        linear_model(),
        max_batch=4,
        max_wait_ms=30_000,
        example={"observation/state": obs[0]},
    ) as server:
        with WebsocketPolicy(f"ws://{server.address}", timeout=20) as policy:
            assert policy.client.batching  # serve-policy's metadata: max_batch 4
            policy._plan(obs)  # four connections
            for rows in (3, 1, 2):
                t0 = time.monotonic()
                got = policy._plan(obs[:rows])
                assert time.monotonic() - t0 < 10  # not the server's 30 s wait
                np.testing.assert_allclose(
                    got, [linear_reference(x) for x in obs[:rows]], rtol=1e-5, atol=1e-6
                )
            assert policy.client.requests == 4 + 3 + 1 + 2
        assert server.stats.batch_sizes == {4: 1, 3: 1, 1: 1, 2: 1}


# End to end ---------------------------------------------------------------------------
def plain_loop(seeds, horizon):
    """Per-episode returns of a gymnasium loop calling ``cartpole_chunk``
    directly, replanning every ``horizon`` steps; and its plans."""
    env = gym.make("CartPole-v1")
    returns, plans = [], 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done, t = 0.0, False, 0
        while not done:
            if t % horizon == 0:
                chunk, plans = cartpole_chunk(obs), plans + 1
            obs, r, term, trunc, _ = env.step(int(chunk[t % horizon]))
            total, done, t = total + r, term or trunc, t + 1
        returns.append(total)
    env.close()
    return returns, plans


@pytest.mark.parametrize("num_envs, workers", [(1, None), (3, None), (4, 2)])
def test_evaluate_equals_a_plain_loop_with_one_request_per_plan(num_envs, workers):
    seeds = [3, 1, 4, 15, 9]
    want, plans = plain_loop(seeds, horizon=K)
    with Server(policy=cartpole_chunk) as server:
        with jaxmesh.RemotePolicy(server.address) as policy:
            assert isinstance(policy, WebsocketPolicy)
            probes = count_probes(policy)
            result = jaxmesh.evaluate(
                policy,
                "gymnasium:CartPole-v1",
                seeds=seeds,
                num_envs=num_envs,
                horizon=K,
                workers=workers,
            )
    np.testing.assert_array_equal(result.returns, want)
    # One request per plan (none for replayed steps), besides the one row of
    # zeros HostPolicy sends to learn the output's shape when the run traces.
    assert len(server.requests) - probes[0] == plans
    assert probes[0] <= 1


def test_a_server_error_mid_run_keeps_the_finished_episodes():
    seeds = [3, 1, 4, 15, 9]
    want, _ = plain_loop(seeds, horizon=K)
    with Server(policy=cartpole_chunk) as server:
        server.fail_after = 12
        with jaxmesh.RemotePolicy(server.address) as policy:
            with pytest.raises(HostPolicyError, match="ValueError") as info:
                jaxmesh.evaluate(
                    policy, "gymnasium:CartPole-v1", seeds=seeds, num_envs=1, horizon=K
                )
    cause = info.value.__cause__
    assert isinstance(cause, RemotePolicyError) and cause.address == server.address
    partial = info.value.partial_result
    assert 0 < len(partial.returns) < len(seeds)
    np.testing.assert_array_equal(partial.returns, want[: len(partial.returns)])


class TaskEnv(gym.Env):
    """Six steps of a state that counts them; reset's info names the task."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-9, 9, (3,))})
    action_space = gym.spaces.Box(-99, 99, (2,))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"language": f"task {seed}"}

    def _obs(self):
        return {"pos": np.full(3, self.t, np.float32)}

    def step(self, action):
        self.t += 1
        return self._obs(), float(np.sum(action)), self.t >= 6, False, {}


def test_each_lane_sends_its_episodes_instruction_as_the_prompt():
    def inputs(obs, instruction):
        return {"observation/state": obs["pos"], "prompt": instruction}

    run = dict(seeds=[1, 2], num_envs=2, horizon=K)
    with Server() as server:
        with jaxmesh.RemotePolicy(
            server.address, inputs, instructions="language"
        ) as policy:
            probes = count_probes(policy)
            jaxmesh.evaluate(policy, TaskEnv(), **run)
            prompts = [r["prompt"] for r in server.requests[probes[0] :]]
            assert sorted(prompts) == ["task 1"] * 2 + ["task 2"] * 2
            server.requests.clear()
            starts = jaxmesh.Starts(instruction="stack the cups")
            jaxmesh.evaluate(policy, TaskEnv(), starts=starts, **run)
            assert {r["prompt"] for r in server.requests} == {"stack the cups"}


def test_the_cli_evaluates_a_served_policy_from_a_config(tmp_path, monkeypatch):
    built = []

    class Recorded(WebsocketPolicy):  # closed at the end (the CLI keeps it open)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(remote, "WebsocketPolicy", Recorded)
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread
    seeds = [3, 1, 4]
    want, _ = plain_loop(seeds, horizon=K)
    with Server(policy=cartpole_chunk) as server:
        config = tmp_path / "served.yaml"
        config.write_text(
            "policy: jaxmesh.serve.remote:RemotePolicy\n"
            "policy_config:\n  address: ws://127.0.0.1:1\n"
            f"env: gymnasium:CartPole-v1\nseeds: {seeds}\nhorizon: {K}\n"
            f"output: {tmp_path / 'out.json'}\n"
        )
        address = f"policy_config.address={server.address}"
        try:
            assert main(["eval", str(config), "--set", address]) == 0
        finally:
            for policy in built:
                policy.close()
        assert len(built) == 1
    episodes = json.loads((tmp_path / "out.json").read_text())["episodes"]
    assert [e["return"] for e in episodes] == want


def count_probes(policy: WebsocketPolicy) -> list[int]:
    """Counts the requests ``policy`` sends to learn its output's shape."""
    probes, output = [0], policy._output

    def counted(inputs):
        before = policy.client.requests
        out = output(inputs)
        probes[0] += policy.client.requests - before
        return out

    policy._output = counted
    return probes


# openpi's LIBERO preprocessing --------------------------------------------------------
def test_libero_inputs_rotate_resize_and_build_the_state_by_hand():
    image = np.arange(1, 7, dtype=np.uint8).reshape(2, 3, 1).repeat(3, axis=2)
    half = math.sqrt(0.5)  # a quarter turn about z: (x, y, z, w)
    obs = {
        "agentview_image": image,
        "robot0_eye_in_hand_image": image * 2,
        "robot0_eef_pos": np.array([0.1, 0.2, 0.3]),
        "robot0_eef_quat": np.array([0.0, 0.0, half, half]),
        "robot0_gripper_qpos": np.array([0.04, -0.04]),
    }
    request = libero_inputs(obs, "pick up the bowl", size=3)
    assert set(request) == {
        "observation/image",
        "observation/wrist_image",
        "observation/state",
        "prompt",
    }
    # Rotated 180 degrees, then padded (no resize: the long side is already 3).
    want = np.array([[6, 5, 4], [3, 2, 1], [0, 0, 0]], np.uint8)
    np.testing.assert_array_equal(request["observation/image"][..., 0], want)
    np.testing.assert_array_equal(request["observation/wrist_image"][..., 1], want * 2)
    np.testing.assert_allclose(
        request["observation/state"],
        [0.1, 0.2, 0.3, 0.0, 0.0, math.pi / 2, 0.04, -0.04],
        atol=1e-12,
    )
    assert request["prompt"] == "pick up the bowl"
    np.testing.assert_array_equal(quat_to_axis_angle(np.array([0, 0, 0, 1.0])), 0)
    # w > 1 (rounding) is clipped: no rotation, not a NaN.
    np.testing.assert_array_equal(quat_to_axis_angle(np.array([0, 0, 0, 1.0001])), 0)
    np.testing.assert_allclose(
        quat_to_axis_angle(np.array([1.0, 0, 0, 0])), [math.pi, 0, 0], atol=1e-12
    )


@pytest.mark.parametrize("shape", [(256, 256), (128, 128), (200, 100), (37, 61)])
def test_resize_with_pad_equals_openpis(shape):
    rng = np.random.default_rng(sum(shape))
    image = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    want = image_tools.resize_with_pad(image, 224, 224)
    got = resize_with_pad(image, 224)
    assert got.shape == want.shape == (224, 224, 3)
    np.testing.assert_array_equal(got, want)


def libero_chunk(request: dict) -> np.ndarray:
    """A chunk of 5 LIBERO actions from openpi's request, of exact values (so
    float32 and float64 states choose the same ones)."""
    side = 0.25 if request[STATE][0] > 0 else -0.25
    bright = 0.25 if request["observation/image"].mean() > 60 else -0.25
    return np.array(
        [[side, bright, 0, 0, 0, 0.5 * (k % 2), -1] for k in range(5)], np.float32
    )


def libero_loop(task: int, seed: int, trial: int, steps: int, settle: int, size: int):
    """openpi's LIBERO client loop (examples/libero/main.py) over LIBERO's own
    env, calling ``libero_chunk`` directly: the end-effector positions."""
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    suite = benchmark.get_benchmark_dict()["libero_spatial"]()
    t = suite.get_task(task)
    bddl = os.path.join(get_libero_path("bddl_files"), t.problem_folder, t.bddl_file)
    env = OffScreenRenderEnv(
        bddl_file_name=bddl, camera_heights=size, camera_widths=size
    )
    try:
        env.seed(seed)
        env.reset()
        obs = env.set_init_state(suite.get_task_init_states(task)[trial])
        for _ in range(settle):
            obs, *_ = env.step([0.0] * 6 + [-1.0])
        seen, plan = [obs["robot0_eef_pos"].copy()], collections.deque()
        for _ in range(steps):
            if not plan:
                plan.extend(libero_chunk(libero_inputs(obs, t.language))[:5])
            obs, _, done, _ = env.step(plan.popleft().tolist())
            seen.append(obs["robot0_eef_pos"].copy())
            if done:
                break
        return np.stack(seen), t.language
    finally:
        env.close()


def test_a_libero_episode_equals_openpis_client_loop(monkeypatch):
    pytest.importorskip("libero.libero", reason="pip install 'jaxmesh[libero]'")
    # jaxmesh picks a headless OpenGL for this process (first, for both
    # sides); it stays this test's.
    for name in ("MUJOCO_GL", "PYOPENGL_PLATFORM"):
        was = os.environ.get(name)
        monkeypatch.setenv(name, "" if was is None else was)
        if was is None:
            monkeypatch.delenv(name)
    with Server(policy=libero_chunk, metadata={"action_horizon": 5}, reads=None) as srv:
        with jaxmesh.RemotePolicy(
            srv.address, inputs=libero_inputs, instructions="language"
        ) as policy:
            probes = count_probes(policy)
            result = jaxmesh.evaluate(
                policy,
                "libero:libero_spatial/1",
                env_config={"camera_size": 32, "settle_steps": 2},
                seeds=[5],
                starts=jaxmesh.Starts(trial_index_base=2),
                num_envs=1,
                horizon=5,
                max_episode_steps=7,
                record=jaxmesh.Record(episodes=[0], keys=["robot0_eef_pos"]),
            )
    want, language = libero_loop(task=1, seed=5, trial=2, steps=7, settle=2, size=32)
    seen = np.asarray(result.trajectories[0].observations["robot0_eef_pos"])
    np.testing.assert_allclose(seen, want, rtol=0, atol=1e-6)
    requests = srv.requests[probes[0] :]
    assert len(requests) == 2  # steps 0 and 5 plan
    assert {r["prompt"] for r in requests} == {language}
    assert requests[0]["observation/image"].shape == (224, 224, 3)
