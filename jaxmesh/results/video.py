"""Videos of recorded episodes: ``jaxmesh.render(result, episode=0, path=...)``.

Where the frames come from, in order, and each source's limits: docs/
evaluation.md, "Recording episodes and videos".
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np

from jaxmesh.envs import make_env

#: Frames per second when neither ``fps=`` nor the env says.
DEFAULT_FPS = 30


def replay_states(env: Any, trajectory: Any) -> list:
    """The env states of a recorded episode, replayed from its seed with the
    recorded actions and the episode's env keys (CONTRACT 5).

    Raises:
      ValueError: the replayed observations differ from the recorded ones.
    """
    key = jax.random.PRNGKey(trajectory.seed)
    env_key = jax.random.fold_in(key, 0)
    obs, state = jax.jit(env.reset)(key)
    step = jax.jit(env.step)
    states, observations = [state], [obs]
    for t, action in enumerate(trajectory.actions):
        obs, state = step(jax.random.fold_in(env_key, t), state, action)[:2]
        states.append(state)
        observations.append(obs)
    recorded = trajectory.observations
    if not isinstance(recorded, dict):
        got = np.stack([np.asarray(o) for o in observations])
        if got.shape != recorded.shape or not np.allclose(got, recorded, atol=1e-5):
            raise ValueError(
                f"replaying episode {trajectory.episode} on env "
                f"{getattr(env, 'name', env)!r} does not give the recorded "
                "observations: pass env= the env (with its params) the run used; "
                "or, for a long episode of an unstable system (the open-loop "
                "replay drifts from the run), record its states "
                "(Record(states=True): MuJoCo Playground and brax envs) and draw "
                "with the env's renderer (no frames=)"
            )
    return states


def recorded_states(env: Any, trajectory: Any) -> list:
    """An episode's ``Trajectory.states`` as the adapter states that
    ``playground_frames`` / ``brax_frames`` draw.

    Raises:
      ValueError: the states do not fit the env's, or it has no renderer.
    """
    states = trajectory.states
    name = str(getattr(env, "name", ""))
    key = jax.ShapeDtypeStruct((2,), np.uint32)
    want = jax.eval_shape(lambda k: env.render_state(env.reset(k)[1]), key)
    want = {k: tuple(v.shape) for k, v in want.items()}
    have = {k: tuple(np.shape(v)[1:]) for k, v in states.items()}
    if want != have:
        raise ValueError(
            f"the recorded states of episode {trajectory.episode} ({have}) are "
            f"not those of env {name!r} ({want}): pass env= the env the run used"
        )
    at = [
        SimpleNamespace(**{k: np.asarray(v[t]) for k, v in states.items()})
        for t in range(trajectory.steps + 1)
    ]
    if name.startswith("playground:"):
        return [(SimpleNamespace(data=d), t, ()) for t, d in enumerate(at)]
    if name.startswith("brax:"):
        return [(SimpleNamespace(pipeline_state=p), t) for t, p in enumerate(at)]
    raise ValueError(
        f"env {name!r} has no renderer jaxmesh knows for its recorded states; "
        "pass frames=fn, fn(obs, state) -> rgb array [H, W, 3]"
    )


def gymnax_frames(env: Any, states: list) -> list[np.ndarray]:
    """gymnax's own drawing of each state: classic control through
    gymnasium's renderer (``gymnax.visualize.vis_gym``), the others through
    gymnax's ``Visualizer`` on an Agg canvas of its own (not pyplot's)."""
    from gymnax.visualize import vis_gym

    name = env.env.name
    if name in vis_gym.SUPPORTED_GYM_ENVS:
        import gymnasium

        try:  # gymnasium's classic-control renderer draws with pygame
            import pygame  # noqa: F401
        except ImportError as e:
            raise ImportError(
                f"drawing gymnax's {name} needs pygame: pip install "
                "'jaxmesh[video]'; or pass jaxmesh.render(..., frames=fn)"
            ) from e

        # pygame (gymnasium's renderer) needs no display or sound card here.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        gym_env = gymnasium.make(name, render_mode="rgb_array")
        try:
            gym_env.reset(seed=0)
            inner = gym_env.unwrapped
            vis_gym.set_gym_params(inner, name, env.params)
            out = []
            for state in states:
                inner.state = vis_gym.get_gym_state(state, name)
                if name == "Pendulum-v1":
                    inner.last_u = np.asarray(state.last_u, dtype=np.float64)
                out.append(np.asarray(gym_env.render()))
            return out
        finally:
            gym_env.close()
    from gymnax.visualize.visualizer import Visualizer
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    vis = Visualizer.__new__(Visualizer)  # its figure would come from pyplot
    vis.env, vis.env_params = env.env, env.params
    vis.state_seq, vis.reward_seq = states, None
    vis.fig = Figure(figsize=(4, 3.2), dpi=80)
    canvas = FigureCanvasAgg(vis.fig)
    vis.ax = vis.fig.add_subplot(1, 1, 1)
    vis.init()
    out = []
    for i in range(len(states)):
        vis.update(i)
        canvas.draw()
        out.append(np.asarray(canvas.buffer_rgba())[..., :3].copy())
    return out


def brax_frames(env: Any, states: list) -> list[np.ndarray]:
    """brax's renderer (``brax.io.image``) over the pipeline states (MuJoCo's
    OpenGL: headless, ``MUJOCO_GL=egl`` before MuJoCo is imported)."""
    try:
        from brax.io import image
    except ImportError as e:
        raise ImportError(
            f"brax renders with brax.io.image, which failed to import ({e}); "
            "or pass jaxmesh.render(..., frames=fn)"
        ) from e
    pipeline = [s[0].pipeline_state for s in states]
    with _needs_gl("brax's renderer"):
        return list(image.render_array(env.env.sys, pipeline, height=240, width=320))


@contextlib.contextmanager
def _needs_gl(who: str):
    """Turns MuJoCo's missing-OpenGL failure into a RuntimeError saying what to do."""
    try:
        yield
    except Exception as e:
        if "OpenGL" not in str(e) and "EGL" not in type(e).__name__:
            raise
        raise RuntimeError(
            f"{who} found no OpenGL context ({e}); start Python with "
            "MUJOCO_GL=egl (headless) in its environment, or pass "
            "jaxmesh.render(..., frames=fn)"
        ) from e


def playground_frames(env: Any, states: list) -> list[np.ndarray]:
    """MuJoCo Playground's renderer (``env.render``) over the states, 240 x
    320, of the env's own model (a randomizer's fields do not show; headless:
    ``MUJOCO_GL=egl``)."""
    trajectory = [s[0] for s in states]  # the adapter's (state, t, drawn)
    with _needs_gl("Playground's renderer"):
        return [np.asarray(f) for f in env.env.render(trajectory, 240, 320)]


def _env_for(result: Any, env: Any, replay: bool = True) -> Any:
    """The JAX env to replay on (``replay=False``: whose renderer draws the
    recorded states): ``env``, or made from ``result.env``."""
    if env is not None:
        return make_env(env)
    name = str(result.env)
    if not replay:  # the drawing is of the env's own model (no randomizer)
        name = name.split("+randomize:")[0]
    if name.startswith("playground:") and "+randomize:" in name:
        raise ValueError(
            f"{name!r} was run with a randomizer, which a result does not keep: "
            "pass env=jaxmesh.envs.playground.randomized(make_env(...), fn), the "
            "env the run used, to replay its episodes"
        )
    if name.startswith(("gymnax:", "brax:", "playground:")):
        return make_env(name)
    return None


def episode_frames(
    result: Any,
    episode: int = 0,
    frames: Callable[[Any, Any], Any] | None = None,
    env: Any = None,
) -> list[np.ndarray]:
    """The RGB frames of a recorded episode (arguments as ``render``'s).

    Raises:
      ValueError: the episode was not recorded, or no frames can be made.
    """
    if result.trajectories is None:
        raise ValueError(
            "this result holds no trajectories: run with record=jaxmesh.Record("
            "episodes=[...]), or, for a result read with RunResult.from_dict, "
            "load them first (result = result.load_trajectories(npz_path))"
        )
    tr = result.trajectory(episode)
    if frames is None and tr.frames is None and tr.states is not None:
        jax_env = _env_for(result, env, replay=False)
        return _draw(jax_env, recorded_states(jax_env, tr))
    if frames is None and tr.frames is not None:
        return list(tr.frames)
    jax_env = _env_for(result, env)
    obs = tr.observations
    steps = tr.steps + 1
    obs_at = [
        {k: v[t] for k, v in obs.items()} if isinstance(obs, dict) else obs[t]
        for t in range(steps)
    ]
    if frames is None and str(result.env).startswith("envpool:"):
        out = []  # uint8 [H, W, 3] as it is; [stack, H, W] or [H, W]: the newest, gray
        for o in map(np.asarray, obs_at):
            if o.dtype == np.uint8 and o.ndim == 3 and o.shape[-1] == 3:
                out.append(o)
            elif o.dtype == np.uint8 and o.ndim in (2, 3):
                gray = o if o.ndim == 2 else o[-1]
                out.append(np.repeat(gray[..., None], 3, axis=-1))
            else:
                raise ValueError(
                    f"env {result.env!r} has no renderer and its observations "
                    f"(shape {o.shape}, {o.dtype}) are not image frames; pass "
                    "frames=fn, fn(obs, None) -> rgb array [H, W, 3]"
                )
        return out
    if jax_env is None:
        if frames is None:
            raise ValueError(
                f"episode {episode} of {result.env!r} has no frames: a host-stepped "
                "run captures them only from envs with render_mode='rgb_array' run "
                "in process (a served env sends none). Pass frames=fn, "
                "fn(obs, None) -> rgb array"
            )
        return [np.asarray(frames(o, None)) for o in obs_at]
    states = replay_states(jax_env, tr)
    if frames is not None:
        return [np.asarray(frames(o, s)) for o, s in zip(obs_at, states, strict=True)]
    return _draw(jax_env, states)


def _draw(env: Any, states: list) -> list[np.ndarray]:
    """The env's own renderer over its (adapter) states, chosen by name."""
    name = str(getattr(env, "name", ""))
    if name.startswith("gymnax:"):
        return gymnax_frames(env, states)
    if name.startswith("brax:"):
        return brax_frames(env, states)
    if name.startswith("playground:"):
        return playground_frames(env, states)
    raise ValueError(
        f"env {name!r} has no renderer jaxmesh knows; pass frames=fn, "
        "fn(obs, state) -> rgb array [H, W, 3]"
    )


def write_video(frames: list, path: str | os.PathLike, fps: float) -> Path:
    """Encodes frames to ``path``: a ``.gif`` with imageio, else ffmpeg.

    Raises:
      ValueError: no frames, or frames of different sizes.
      RuntimeError: ffmpeg could not write ``path``.
    """
    if not frames:
        raise ValueError(f"no frames to write to {path}")
    evened = []
    for f in map(np.asarray, frames):  # uint8 RGB, even sides (H.264's yuv420p)
        if f.dtype != np.uint8:
            f = np.clip(f, 0, 255).astype(np.uint8)
        f = (np.repeat(f[..., None], 3, axis=-1) if f.ndim == 2 else f)[..., :3]
        h, w = f.shape[:2]
        evened.append(np.pad(f, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge"))
    frames = evened
    sizes = {f.shape for f in frames}
    if len(sizes) > 1:
        raise ValueError(
            f"frames of different shapes {sorted(sizes)}; a video needs one size"
        )
    path = Path(path)
    if path.suffix.lower() == ".gif":
        try:
            import imageio
        except ImportError as e:  # pragma: no cover - the extra is part of [test]
            raise ImportError(
                "jaxmesh.render writes GIFs with imageio: pip install "
                "'jaxmesh[video]' (imageio and imageio-ffmpeg)"
            ) from e
        imageio.v3.imwrite(
            path, np.stack(frames), extension=".gif", duration=1000 / fps, loop=0
        )
    else:
        _ffmpeg_write(frames, path, fps)
    return path


def _ffmpeg_write(frames: list[np.ndarray], path: Path, fps: float) -> None:
    """Pipes RGB frames to imageio-ffmpeg's ffmpeg (codec by extension).

    No pre-exec hook (the JAX process is never forked with its threads); its
    messages go to a file, not a pipe that could fill. A failure leaves no
    partial file; an interruption kills ffmpeg first.
    """
    try:
        import imageio_ffmpeg
    except ImportError as e:
        raise ImportError(
            f"writing {path.suffix} needs imageio-ffmpeg: pip install "
            "'jaxmesh[video]' (or write a .gif)"
        ) from e
    h, w = frames[0].shape[:2]
    rate = Fraction(fps).limit_denominator(1001)
    cmd = [
        imageio_ffmpeg.get_ffmpeg_exe(),
        "-hide_banner", "-loglevel", "error", "-y",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}",
        "-framerate", f"{rate.numerator}/{rate.denominator}", "-i", "pipe:0",
        "-an", "-pix_fmt", "yuv420p", str(path),
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log
        )
        try:
            with contextlib.suppress(BrokenPipeError):  # ffmpeg quit: see its log
                for frame in frames:
                    proc.stdin.write(np.ascontiguousarray(frame).tobytes())
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            path.unlink(missing_ok=True)
            raise
        if code != 0:
            log.seek(0)
            said = log.read().decode(errors="replace").strip()
            path.unlink(missing_ok=True)
            raise RuntimeError(
                f"ffmpeg could not write {path} (exit code {code}): "
                f"{said or 'it printed nothing'}. Check that the folder is "
                "writable and has space, and that the extension is a video "
                "format ffmpeg knows (.mp4, .webm, .avi), or write a .gif"
            )


def render(
    result: Any,
    episode: int = 0,
    path: str | os.PathLike = "ep0.mp4",
    frames: Callable[[Any, Any], Any] | None = None,
    fps: float | None = None,
    env: Any = None,
) -> Path:
    """Renders a recorded episode to a video file (``.mp4``, ``.gif``, ...).

    Args:
      result: a ``RunResult`` of a run with ``record=jaxmesh.Record(...)``.
      episode: a recorded episode's index.
      path: the file; ``.gif`` is written as a GIF, other extensions by ffmpeg.
      frames: ``fn(obs, state) -> rgb [H, W, 3]`` uint8; None: the frames
        captured during the run, else the env's renderer (gymnax, brax,
        MuJoCo Playground).
      fps: frames per second (default 30).
      env: the JAX env to replay on or draw with (default: made from
        ``result.env``; pass it when built with other params or a randomizer).

    Returns:
      The path written, also appended to ``result.videos``.

    Raises:
      ValueError: the episode was not recorded, or no frames can be made.
      ImportError: imageio (or imageio-ffmpeg for ``.mp4``) is missing.
    """
    fps = DEFAULT_FPS if fps is None else fps
    if not fps > 0:
        raise ValueError(f"fps={fps!r}: expected a number > 0")
    out = write_video(episode_frames(result, episode, frames, env), path, float(fps))
    if str(out) not in result.videos:
        result.videos.append(str(out))
    return out
