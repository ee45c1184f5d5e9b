"""Videos of recorded episodes (``jaxmesh.render``), the report's videos and
``jaxmesh eval --video``.

Every video is decoded again with imageio and its frames counted; frames made
by a frame function are checked against the env state replayed by gymnax's own
functions.
"""

from __future__ import annotations

import base64
import html.parser
import json
import os
import subprocess
from pathlib import Path

import gymnasium as gym
import gymnax
import imageio
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gym_reference import ID, chunky
from imageio_ffmpeg import count_frames_and_secs, get_ffmpeg_exe

from jaxmesh import evaluate
from jaxmesh.cli import main
from jaxmesh.remote.server import EnvServer
from jaxmesh.results.record import Record
from jaxmesh.results.report import write_report
from jaxmesh.results.video import episode_frames, render, write_video

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole.yaml"


def mp4_frames(path) -> int:
    """The frames ffmpeg decodes (counted without forking this JAX process,
    as imageio's reader would)."""
    return count_frames_and_secs(str(path))[0]


@pytest.fixture(scope="module")
def cartpole():
    return evaluate(
        chunky,
        "gymnax:CartPole-v1",
        horizon=4,
        num_envs=3,
        episodes=4,
        record=Record(episodes=[0, 2], max_steps=30),
    )


def test_gymnax_renderer_to_mp4(cartpole, tmp_path):
    tr = cartpole.trajectory(2)
    path = render(cartpole, episode=2, path=tmp_path / "ep2.mp4", fps=20)
    assert mp4_frames(path) == tr.steps + 1
    assert str(path) in cartpole.videos
    frames, secs = count_frames_and_secs(str(path))
    assert frames / secs == pytest.approx(20)


def test_frame_function_sees_the_replayed_states(cartpole, tmp_path):
    """``frames(obs, state)`` gets each observation with the env state the run
    had there: gymnax's own ``get_obs`` of the state is the observation."""
    env, params = gymnax.make("CartPole-v1")
    seen = []

    def frame(obs, state):
        np.testing.assert_allclose(env.get_obs(state, params), obs, atol=1e-6)
        seen.append(int(state.time))
        # a distinct frame per step (a GIF merges identical neighbours)
        return np.full((8, 10, 3), 8 * len(seen), np.uint8)

    tr = cartpole.trajectory(0)
    path = render(cartpole, episode=0, path=tmp_path / "ep0.gif", frames=frame)
    assert seen == list(range(tr.steps + 1))
    gif = imageio.v3.imread(path)
    assert gif.shape == (tr.steps + 1, 8, 10, 3)
    np.testing.assert_array_equal(gif[:, 0, 0, 0], 8 * np.arange(1, tr.steps + 2))


def test_unrecorded_episode_and_wrong_env(cartpole, tmp_path):
    with pytest.raises(ValueError, match=r"episode 1 was not recorded \(recorded"):
        render(cartpole, episode=1, path=tmp_path / "x.gif")
    other = gymnax.make("CartPole-v1")
    other = (other[0], other[1].replace(gravity=20.0))
    with pytest.raises(ValueError, match="does not give the recorded observations"):
        render(cartpole, episode=0, path=tmp_path / "x.gif", env=other)


def test_gymnasium_frames_captured_during_the_run(tmp_path):
    envs = [gym.make(ID, render_mode="rgb_array") for _ in range(2)]
    r = evaluate(chunky, envs, horizon=4, seeds=[3, 1, 4], record=Record([1]))
    tr = r.trajectory(1)
    # the run's own frames: the first is the reset frame of seed 1
    env = gym.make(ID, render_mode="rgb_array")
    env.reset(seed=1)
    np.testing.assert_array_equal(tr.frames[0], env.render())
    path = render(r, episode=1, path=tmp_path / "ep1.mp4")
    assert mp4_frames(path) == tr.length + 1


def test_mp4_keeps_frames_and_rate_without_forking_jax(tmp_path):
    # 7 flat grays, odd sides (padded to even): H.264 keeps a flat frame's
    # level within a step or two
    levels = [0, 40, 80, 120, 160, 200, 240]
    frames = [np.full((41, 61, 3), v, np.uint8) for v in levels]
    forks = []
    # Python runs at-fork hooks when it forks itself (as a pre-exec hook
    # needs), never when it starts a program with vfork/posix_spawn
    os.register_at_fork(before=lambda: forks.append(1))
    path = write_video(frames, tmp_path / "grays.mp4", fps=29.97)
    assert forks == []
    # decoded by ffmpeg itself to raw RGB (imageio's reader would fork)
    out = subprocess.run(
        [get_ffmpeg_exe(), "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
    )
    assert "62x42" in out.stderr.decode() and "29.97 fps" in out.stderr.decode()
    decoded = np.frombuffer(out.stdout, np.uint8).reshape(-1, 42, 62, 3)
    np.testing.assert_allclose(decoded.mean(axis=(1, 2, 3)), levels, atol=3)


def test_ffmpeg_failure_says_why_and_leaves_no_file(tmp_path):
    frames = [np.zeros((4, 4, 3), np.uint8)]
    with pytest.raises(
        RuntimeError,
        match=r"ffmpeg could not write .*x\.nope.*Unable to choose an output format",
    ):
        write_video(frames, tmp_path / "x.nope", fps=10)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_ends_ffmpeg_and_leaves_no_file(tmp_path, monkeypatch):
    started = []

    class Interrupting(subprocess.Popen):
        """The real ffmpeg, whose input is cut by Ctrl-C at the second frame."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.stdin is None:  # not the writer (a version check, say)
                return
            started.append(self)
            write, sent = self.stdin.write, []

            def interrupted(data):
                if sent:
                    raise KeyboardInterrupt
                sent.append(write(data))

            self.stdin.write = interrupted

    monkeypatch.setattr(subprocess, "Popen", Interrupting)
    frames = [np.zeros((8, 8, 3), np.uint8)] * 5
    with pytest.raises(KeyboardInterrupt):
        write_video(frames, tmp_path / "cut.mp4", fps=10)
    (proc,) = started
    assert proc.returncode is not None and not Path(f"/proc/{proc.pid}").exists()
    assert list(tmp_path.iterdir()) == []


def test_served_run_needs_a_frame_function(tmp_path):
    with EnvServer([gym.make(ID)], "127.0.0.1:0") as server:
        r = evaluate(
            chunky,
            f"grpc://{server.address}",
            horizon=4,
            seeds=[3],
            record=Record([0]),
        )
    with pytest.raises(ValueError, match="frames=fn"):
        render(r, episode=0, path=tmp_path / "ep0.gif")
    frames = episode_frames(r, 0, frames=lambda obs, state: np.zeros((4, 4, 3)))
    assert len(frames) == r.lengths[0] + 1


class Media(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("video", "img") and a.get("src", "").startswith("data:"):
            self.sources.append((tag, a["src"]))


def embedded(page: str) -> list:
    p = Media()
    p.feed(page)
    return [
        (tag, src.split(";")[0][5:], base64.b64decode(src.split(",", 1)[1]))
        for tag, src in p.sources
        if not src.startswith("data:image/png")
    ]


def test_report_embeds_the_videos(cartpole, tmp_path):
    cartpole.videos.clear()
    mp4 = render(cartpole, 0, tmp_path / "ep0.mp4")
    gif = render(cartpole, 2, tmp_path / "ep2.gif")
    page = write_report(cartpole, tmp_path / "r.html").read_text()
    assert "id='videos'" in page
    media = embedded(page)
    assert media == [
        ("video", "video/mp4", mp4.read_bytes()),
        ("img", "image/gif", gif.read_bytes()),
    ]
    cartpole.videos.clear()
    assert "id='videos'" not in write_report(cartpole, tmp_path / "n.html").read_text()


def test_eval_video_and_report(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMESH_COMPILE_CACHE", "0")
    out = tmp_path / "r.json"
    argv = ["eval", str(CONFIG), "--set", "episodes=3", "--set", "num_envs=4"]
    argv += ["--set", f"output={out}", "--set", "max_episode_steps=40"]
    assert main([*argv, "--no-progress", "--video", "--report"]) == 0
    video = tmp_path / "r.ep0.mp4"
    data = json.loads(out.read_text())
    assert data["videos"] == ["r.ep0.mp4"]
    assert data["recorded"] == [
        {"episode": 0, "seed": 0, "length": 40, "steps": 40, "cut": False}
    ]
    assert mp4_frames(video) == 41
    assert (tmp_path / "r.npz").is_file()
    page = (tmp_path / "r.html").read_text()
    assert embedded(page) == [("video", "video/mp4", video.read_bytes())]
    # jaxmesh report reads the video next to the JSON: the same page
    assert main(["report", str(out), "-o", str(tmp_path / "again.html")]) == 0
    assert (tmp_path / "again.html").read_text() == page


def test_record_config_key(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMESH_COMPILE_CACHE", "0")
    out = tmp_path / "r.json"
    argv = ["eval", str(CONFIG), "--set", "episodes=3", "--set", "num_envs=4"]
    argv += ["--set", f"output={out}", "--set", "record=[1, 2]", "--no-progress"]
    assert main([*argv, "--set", "max_episode_steps=12"]) == 0
    data = json.loads(out.read_text())
    assert [r["episode"] for r in data["recorded"]] == [1, 2]
    assert "videos" not in data
    assert main([*argv[:-1], "--set", "record={episodes: 7}"]) == 2


def test_jax_key_replay_matches_contract(cartpole):
    """The replay uses the episode's own keys (CONTRACT 5): the states it gives
    for episode 2 are those of gymnax's step_env with fold_in keys."""
    env, params = gymnax.make("CartPole-v1")
    tr = cartpole.trajectory(2)
    key = jax.random.PRNGKey(tr.seed)
    _, state = env.reset_env(key, params)
    for t, a in enumerate(tr.actions):
        k = jax.random.fold_in(jax.random.fold_in(key, 0), t)
        _, state, *_ = env.step_env(k, state, jnp.int32(a), params)
    np.testing.assert_allclose(
        env.get_obs(state, params), tr.observations[-1], atol=1e-6
    )
