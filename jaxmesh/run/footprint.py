"""What a spec reads from an env and the frame windows it holds per lane
(``jaxmesh.explain``, ``check_frame_limit``), by shape only."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxmesh import adapt
from jaxmesh.adapt import WHOLE_OBS
from jaxmesh.envs import make_env
from jaxmesh.params import _jsonable
from jaxmesh.run.checks import human_bytes
from jaxmesh.run.instructions import source
from jaxmesh.types import PolicyLike

#: Environment variable holding the frame-window limit in bytes.
LIMIT_ENV = "JAXMESH_FRAME_HISTORY_LIMIT_BYTES"
DEFAULT_LIMIT_BYTES = 2 * 1024**3
#: A PRNG key, abstract: nothing traced with it runs eagerly.
KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """One model input: its processed frame and the window the engine keeps.

    Attributes:
      name: the input's name in the spec (``"__obs__"`` without a spec).
      kind: ``"State"``, ``"Image"``, ``"Previous"``, ``"Text"`` or
        ``"PendingChunk"``.
      key: the observation key read (None: the whole observation, or none for
        ``Previous``).
      shape: the processed frame's shape (a pytree of shapes for a pytree).
      dtype: the frame's dtype name (a pytree of names likewise).
      stack: frames in the window.
      window_shape: ``(stack,) + shape``, what the policy sees when stack > 1.
      bytes_per_lane: bytes of the window for one lane.
      steps: an ``Image``'s transforms of the leaf, in order (``Image.steps``).
      instruction: a ``Text``'s instruction source per run (key ``""``) or
        task; its ``shape`` and ``dtype`` are the encoding's (None until a
        string is encoded).
    """

    name: str
    kind: str
    key: str | None
    shape: Any
    dtype: Any
    stack: int
    window_shape: Any
    bytes_per_lane: int
    steps: list[str] = dataclasses.field(default_factory=list)
    instruction: dict[str, str] | None = None

    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What the evaluator reads from an env for a spec, and its frame memory.

    Attributes:
      env: the env's name.
      policy: the model's name (None for a bare spec).
      leaves: observation keys read; None stands for the whole observation.
      inputs: input name -> ``InputInfo``, in spec order.
      num_envs: lanes the totals are for.
      bytes_per_lane: frame-window bytes of one lane (all inputs).
      total_bytes: ``bytes_per_lane * num_envs``.
      limit_bytes: the current ``JAXMESH_FRAME_HISTORY_LIMIT_BYTES``.
    """

    env: str
    policy: str | None
    leaves: list[str | None]
    inputs: dict[str, InputInfo]
    num_envs: int
    bytes_per_lane: int
    total_bytes: int
    limit_bytes: int

    @property
    def within_limit(self) -> bool:
        return self.total_bytes <= self.limit_bytes

    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))

    def __str__(self) -> str:
        who = f"{self.policy} on " if self.policy else ""
        reads = ", ".join(
            "the whole observation" if k is None else repr(k) for k in self.leaves
        )
        head = ("input", "kind", "key", "frame", "dtype", "stack", "bytes/lane")
        rows = [head] + [
            (
                "(observation, no spec)" if info.name == WHOLE_OBS else info.name,
                info.kind,
                "-" if info.key is None else str(info.key),
                *map(str, (info.shape, info.dtype, info.stack)),
                f"{info.bytes_per_lane:,}",
            )
            for info in self.inputs.values()
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        cells = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
        table = [("  " + cells(r)).rstrip() for r in rows]
        prep = [
            f"  {'(observation)' if i.name == WHOLE_OBS else i.name}: "
            + (" -> ".join(i.steps) or "as read")
            for i in self.inputs.values()
            if i.kind == "Image"
        ]
        texts = [
            f"  {i.name}{f'[{task}]' if task else ''}: {where} -> "
            + (
                "encoded at the first reset"
                if i.shape is None
                else f"encoded {i.dtype} {i.shape}"
            )
            for i in self.inputs.values()
            if i.instruction is not None
            for task, where in i.instruction.items()
        ]
        status = "within" if self.within_limit else "OVER"
        return "\n".join(
            [
                f"explain: {who}{self.env}, {self.num_envs} lane(s)",
                f"reads: {reads}",
                *table,
                *(["preprocessing:", *prep] if prep else []),
                *(["instructions:", *texts] if texts else []),
                f"frame windows: {self.bytes_per_lane:,} B per lane; "
                f"{human_bytes(self.total_bytes)} for {self.num_envs} lane(s) "
                f"({status} the limit of {human_bytes(self.limit_bytes)}, {LIMIT_ENV})",
            ]
        )


def frame_limit_bytes() -> int:
    """The limit from ``JAXMESH_FRAME_HISTORY_LIMIT_BYTES`` (default 2 GiB)."""
    raw = os.environ.get(LIMIT_ENV, "")
    if not raw.strip():
        return DEFAULT_LIMIT_BYTES
    with contextlib.suppress(ValueError):
        if (value := int(raw.strip().replace("_", ""))) >= 0:
            return value
    raise ValueError(
        f"{LIMIT_ENV}={raw!r}: expected a non-negative integer number of bytes "
        f"(e.g. {DEFAULT_LIMIT_BYTES} for 2 GiB); unset it for the default"
    )


def _spec_of(spec_or_model: Any) -> tuple[Mapping[str, adapt.Input] | None, Any]:
    if isinstance(spec_or_model, PolicyLike):
        # A model as the engine sees it: a spec set by its load is read.
        policy = spec_or_model.as_policy(with_params=False)
        return policy.spec, policy.name
    if spec_or_model is None or isinstance(spec_or_model, Mapping):
        return adapt.check_spec(spec_or_model), None
    if callable(spec_or_model):  # a plain policy function: no spec
        return None, getattr(spec_or_model, "__name__", None)
    raise TypeError(
        f"explain({spec_or_model!r}): expected a spec dict (name -> "
        "jaxmesh.adapt.State/Image/Previous), a jaxmesh.Model (or any object "
        "with as_policy), a policy function or None"
    )


def _nbytes(tree: Any) -> int:
    return sum(
        math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)
    )


def _is_leaf(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def _layout(tree: Any) -> tuple[Any, Any]:
    """The shapes and dtype names of a pytree of ``ShapeDtypeStruct``s."""
    shape = jax.tree.map(lambda x: tuple(x.shape), tree, is_leaf=_is_leaf)
    dtype = jax.tree.map(lambda x: jnp.dtype(x.dtype).name, tree, is_leaf=_is_leaf)
    return shape, dtype


def _text_info(name: str, decl: adapt.Text, instruction: Any) -> InputInfo:
    """A Text input's row: its encoding and each run's or task's source."""
    given = instruction if isinstance(instruction, Mapping) else {"": instruction}
    where = {}
    for task, text in given.items():
        if text is not None:
            decl.encoded(text)
        where[str(task)] = source(decl, text)
    sig = decl.signature()
    shape, dtype = (None, None) if sig is None else _layout(sig)
    size = 0 if sig is None else _nbytes(sig)
    # name, kind, key, shape, dtype, stack, window_shape, bytes_per_lane
    args = (name, "Text", decl.info_key, shape, dtype, 1, shape, size)
    return InputInfo(*args, instruction=where)


def _pending_info(name: str, decl: adapt.PendingChunk, action: Any) -> InputInfo:
    """A PendingChunk input's row: the tail's shapes (``"K"``: undeclared)."""
    k = "K" if decl.length is None else decl.length
    shape = {"actions": (k, *action.shape), "mask": (k,), "delay": ()}
    dtype = {"actions": jnp.dtype(action.dtype).name, "mask": "bool", "delay": "int32"}
    return InputInfo(name, "PendingChunk", None, shape, dtype, 1, shape, 0)


def footprint(
    spec_or_model: Any, env: Any, num_envs: int = 1, instruction: Any = None
) -> Explanation:
    """``jaxmesh.explain`` of a spec or model on ``env`` (not a suite)."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs={num_envs!r}: expected an int >= 1")
    spec, policy = _spec_of(spec_or_model)
    env_obj = make_env(env)
    obs = jax.eval_shape(lambda k: env_obj.reset(k)[0], KEY)
    action = jax.ShapeDtypeStruct(tuple(env_obj.action_shape), env_obj.action_dtype)
    items = {WHOLE_OBS: adapt.State()} if spec is None else dict(spec)
    inputs: dict[str, InputInfo] = {}
    for name, decl in items.items():
        if isinstance(decl, adapt.Text):
            inputs[name] = _text_info(name, decl, instruction)
            continue
        if isinstance(decl, adapt.PendingChunk):
            inputs[name] = _pending_info(name, decl, action)
            continue
        frame = jax.eval_shape(decl.frame, obs, action)
        shape, dtype = _layout(frame)
        steps = []  # an Image's transforms of its (abstract) leaf
        if isinstance(decl, adapt.Image):
            leaf = adapt._leaf(decl, obs)
            steps = decl.steps(tuple(leaf.shape), leaf.dtype)
        window = jax.tree.map(
            lambda x, s=decl.stack: (s, *x.shape), frame, is_leaf=_is_leaf
        )
        inputs[name] = InputInfo(
            name=name,
            kind=type(decl).__name__,
            key=getattr(decl, "key", None),
            shape=shape,
            dtype=dtype,
            stack=decl.stack,
            window_shape=window,
            bytes_per_lane=decl.stack * _nbytes(frame),
            steps=steps,
        )
    per_lane = sum(i.bytes_per_lane for i in inputs.values())
    return Explanation(
        env=getattr(env_obj, "name", type(env_obj).__name__),
        policy=policy,
        leaves=adapt.read_keys(spec),
        inputs=inputs,
        num_envs=num_envs,
        bytes_per_lane=per_lane,
        total_bytes=per_lane * num_envs,
        limit_bytes=frame_limit_bytes(),
    )


def check_frame_limit(spec_or_model: Any, env: Any, num_envs: int) -> Explanation:
    """Refuses a run whose frame windows would exceed the limit.

    Args:
      spec_or_model: as for ``jaxmesh.explain``.
      env: anything ``jaxmesh.make_env`` accepts.
      num_envs: the lanes the run will hold.

    Returns:
      The ``Explanation`` when the run fits.

    Raises:
      ValueError: the windows exceed the limit (both figures, the largest
        input, and what to change).
    """
    ex = footprint(spec_or_model, env, num_envs=num_envs)
    if ex.within_limit:
        return ex
    big = max(ex.inputs.values(), key=lambda i: i.bytes_per_lane)
    fits = max(ex.limit_bytes // max(ex.bytes_per_lane, 1), 0)
    raise ValueError(
        f"the frame windows of {num_envs} lanes would hold "
        f"{human_bytes(ex.total_bytes)} ({ex.bytes_per_lane:,} B per lane), over the "
        f"limit of {human_bytes(ex.limit_bytes)} set by {LIMIT_ENV}. The largest input "
        f"is {big.name!r} ({big.kind}, window {big.window_shape} "
        f"{big.dtype}, {big.bytes_per_lane:,} B per lane). Use at most "
        f"{fits} lanes (num_envs), a smaller stack or Image size, or raise "
        f"{LIMIT_ENV} if the device has the memory"
    )
