"""A model as a server runs it: one request's raw observation read on the host
(``ServedModel.prepare``), and a batch of them through one jitted forward that
applies the model's spec and calls its batched corner (``ServedModel.run``).

The forward is compiled once per observation layout for each of a few fixed
batch sizes (``batch_sizes``: powers of two up to ``max_batch``, and
``max_batch`` itself); a batch is padded up to the next size with copies of its
first row, whose outputs are dropped. So after the first request of a layout
(or ``warm_up``) nothing compiles again, whatever the batch.

What the spec reads, per request: ``State`` and ``Image`` read ``obs[key]``
(the key as it is: openpi's flat names with slashes, ``observation/image``,
are plain keys), or the whole observation for ``key=None``; an Image is
cropped, rotated, converted and resized inside the forward, on the device.
``Text`` encodes ``obs[info_key]`` (``obs["prompt"]``, openpi's name, when it
has no ``info_key``) on the host, once per distinct string. A model without a
spec sees the observation's arrays (its strings left out).

A served request carries no episode, so what the engine keeps per episode has
no place here: frame windows (``stack > 1``), ``Previous``, ``PendingChunk``
and recurrent state are refused when the server is built.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh import adapt
from jaxmesh.core.policy import declares_chunk, resolve_policy

#: The observation key a ``Text`` input reads when it names no ``info_key``
#: (openpi clients send the instruction as ``prompt``).
PROMPT_KEY = "prompt"
#: The input name of the whole observation of a model without a spec.
WHOLE = adapt.WHOLE_OBS
#: How many observation layouts (shapes and dtypes) one server compiles for;
#: a request of another layout past this is refused.
MAX_LAYOUTS = 8


class RequestError(ValueError):
    """A request the server cannot run: its own fault, reported to its client
    only."""


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes the forward is compiled for: 1, 2, 4, ... below
    ``max_batch``, and ``max_batch``."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return (*sizes, max_batch)


class Prepared(NamedTuple):
    """One request read on the host: its inputs (name -> numpy pytree) and
    their layout (``signature``), which batches share."""

    inputs: dict
    signature: tuple


class Forward(NamedTuple):
    """What ``ServedModel.run`` returns: each row's output (``[K, *A]``), the
    padded batch size it ran at, and the forward's seconds."""

    outputs: list
    padded: int
    seconds: float


def _refused(spec: Mapping[str, Any] | None, recurrent: bool) -> list[str]:
    why = []
    if recurrent:
        why.append("the model is recurrent (it defines initial_state)")
    for name, decl in (spec or {}).items():
        if isinstance(decl, adapt.Previous):
            why.append(f"input {name!r} is Previous (the last executed action)")
        elif isinstance(decl, adapt.PendingChunk):
            why.append(f"input {name!r} is PendingChunk (the previous chunk's tail)")
        elif getattr(decl, "stack", 1) > 1:
            why.append(f"input {name!r} keeps a window of {decl.stack} frames")
    return why


def _array(value: Any, where: str) -> np.ndarray:
    """``value`` as a numpy array of numbers or bools in JAX's dtype."""
    try:
        x = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise RequestError(f"{where}: not an array ({e})") from None
    if x.dtype.kind not in "biuf":
        raise RequestError(
            f"{where} is {type(value).__name__} of dtype {x.dtype}; expected an "
            "array of numbers or bools"
        )
    return x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)


def _arrays_of(obs: Any, where: str) -> Any:
    """A whole observation as a pytree of arrays (a dict's strings left out)."""
    if isinstance(obs, Mapping):
        return {
            k: _arrays_of(v, f"{where}[{k!r}]")
            for k, v in obs.items()
            if not isinstance(v, str | bytes)
        }
    return _array(obs, where)


def _signature(inputs: dict) -> tuple:
    leaves, treedef = jax.tree.flatten(inputs)
    return treedef, tuple((x.shape, x.dtype.str) for x in leaves)


class ServedModel:
    """A model (a ``jaxmesh.Model`` or a single-lane function) ready to serve.

    Args:
      model: the policy; its ``load`` runs here.
      max_batch: the most requests one forward takes.
      seed: the base of a stochastic policy's keys (request i gets
        ``fold_in(PRNGKey(seed), i)``).

    Raises:
      ValueError: the model keeps state per episode (see the module), or a
        bad ``max_batch``.
    """

    def __init__(self, model: Any, *, max_batch: int, seed: int = 0):
        if not (isinstance(max_batch, int) and not isinstance(max_batch, bool)) or not (
            1 <= max_batch <= 4096
        ):
            raise ValueError(
                f"max_batch={max_batch!r}: expected an int in [1, 4096] (the most "
                "requests one forward takes)"
            )
        pol = resolve_policy(model, with_params=False)
        why = _refused(pol.spec, pol.initial_state is not None)
        if why:
            raise ValueError(
                f"cannot serve policy {pol.name!r}: {'; '.join(why)}. A served "
                "request carries no episode, so the server keeps no state between "
                "requests: serve a model whose inputs are the current observation "
                "(State and Image with stack=1, Text)"
            )
        self.policy = pol
        self.name = pol.name
        self.chunked = declares_chunk(pol)
        #: The actions one reply holds (K, 1 for a single-action model; None:
        #: a chunk of undeclared length).
        self.reply_length = pol.native_chunk if self.chunked else 1
        self.sizes = batch_sizes(max_batch)
        self.max_batch = max_batch
        self.params = pol.default_params()
        self._base_key = jax.random.PRNGKey(seed)
        self._count = 0
        #: (signature, batch size) -> compiled forward.
        self._programs: dict[tuple, Any] = {}
        #: signature -> why it cannot run (the model refused those inputs).
        self._bad: dict[tuple, str] = {}
        self._jit = jax.jit(self._forward)

    # The host side: one request -------------------------------------------
    def prepare(self, obs: Any) -> Prepared:
        """One raw observation as the forward's inputs (numpy, on the host).

        Raises:
          RequestError: a key the spec reads is missing, a leaf is not an
            array of numbers, a Text's instruction is not a string, or the
            inputs have a layout the model already refused.
        """
        spec = self.policy.spec
        if spec is None:
            inputs = {WHOLE: _arrays_of(obs, "the observation")}
        else:
            if not isinstance(obs, Mapping):
                raise RequestError(
                    f"the observation is a {type(obs).__name__}; policy "
                    f"{self.name!r} reads keys {adapt.read_keys(spec)}: send a dict"
                )
            inputs = {}
            for name, decl in spec.items():
                if isinstance(decl, adapt.Text):
                    inputs[name] = self._text(name, decl, obs)
                elif decl.key is None:
                    inputs[name] = _arrays_of(obs, "the observation")
                elif decl.key not in obs:
                    raise RequestError(
                        f"input {name!r} reads observation key {decl.key!r}, which "
                        f"this observation lacks; its keys are {sorted(map(str, obs))}"
                    )
                else:
                    inputs[name] = _array(obs[decl.key], f"observation[{decl.key!r}]")
        sig = _signature(inputs)
        if sig in self._bad:
            raise RequestError(self._bad[sig])
        return Prepared(inputs, sig)

    def _text(self, name: str, decl: adapt.Text, obs: Mapping) -> Any:
        key = decl.info_key or PROMPT_KEY
        text = obs.get(key)
        if not isinstance(text, str):
            got = "missing" if text is None else f"a {type(text).__name__}"
            raise RequestError(
                f"input {name!r} is a Text read from observation key {key!r}, which "
                f"is {got}; send the instruction there as a string"
            )
        try:
            return decl.encoded(text)
        except (TypeError, ValueError) as e:
            raise RequestError(f"input {name!r}: {e}") from None

    # The device side: a batch ---------------------------------------------
    def _forward(self, params: Any, batch: dict, counters: jax.Array) -> jax.Array:
        pol = self.policy
        if pol.spec is None:
            inputs = batch[WHOLE]
        else:
            inputs = {}
            for name, decl in pol.spec.items():
                if isinstance(decl, adapt.Text):
                    inputs[name] = batch[name]
                    continue

                def frame(leaf, d=decl):
                    return d.frame(leaf if d.key is None else {d.key: leaf})

                inputs[name] = jax.vmap(frame)(batch[name])
        keys = jax.vmap(lambda c: jax.random.fold_in(self._base_key, c))(counters)
        out, _ = pol.apply(params, inputs, keys, None)
        out = jnp.asarray(out)
        return out if self.chunked else out[:, None]

    def _size(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def _program(self, sig: tuple, size: int, batch: dict, counters: Any) -> Any:
        program = self._programs.get((sig, size))
        if program is None:
            if (
                sig not in {s for s, _ in self._programs}
                and len({s for s, _ in self._programs}) >= MAX_LAYOUTS
            ):
                raise RequestError(
                    f"this server already runs {MAX_LAYOUTS} observation layouts; "
                    "send observations of the shapes and dtypes it already serves"
                )
            lowered = self._jit.lower(self.params, batch, counters)
            program = self._programs[(sig, size)] = lowered.compile()
        return program

    def run(self, rows: list[Prepared]) -> Forward:
        """The outputs of ``rows`` (all of one signature), through one forward.

        Raises:
          RequestError: the model cannot take inputs of this layout (the
            trace failed; later requests of it are refused at ``prepare``).
        """
        n = len(rows)
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"a batch of {n} rows; expected 1..{self.max_batch}")
        sig = rows[0].signature
        size = self._size(n)
        picked = [r.inputs for r in rows] + [rows[0].inputs] * (size - n)
        batch = jax.tree.map(lambda *xs: np.stack(xs), *picked)
        counters = np.arange(self._count, self._count + size, dtype=np.uint32)
        self._count += n
        batch = self.policy.place(batch)
        t0 = time.perf_counter()
        try:
            program = self._program(sig, size, batch, counters)
        except RequestError:
            raise
        except Exception as e:  # the model's own trace refused these inputs
            why = (
                f"policy {self.name!r} cannot run these inputs: {type(e).__name__}: {e}"
            )
            if sig not in {s for s, _ in self._programs}:
                self._bad[sig] = why
            raise RequestError(why) from e
        out = np.asarray(jax.device_get(program(self.params, batch, counters)))
        seconds = time.perf_counter() - t0
        return Forward([out[i] for i in range(n)], size, seconds)

    def warm_up(self, prepared: Prepared) -> None:
        """Compiles the forward for ``prepared``'s layout at every batch size
        (and runs each once), so that serving it compiles nothing."""
        for size in self.sizes:
            self.run([prepared] * size)

    def compiled(self) -> int:
        """How many programs have been compiled (layouts x batch sizes)."""
        return len(self._programs)


__all__ = [
    "Forward",
    "MAX_LAYOUTS",
    "PROMPT_KEY",
    "Prepared",
    "RequestError",
    "ServedModel",
    "batch_sizes",
]
