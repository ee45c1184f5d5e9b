"""A model as a server runs it: a request's observation read on the host, and
a batch of them through one jitted forward (docs/serving.md, "What the server
does with an observation").
"""

from __future__ import annotations

import re
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmesh import adapt
from jaxmesh.core.policy import declares_chunk, resolve_policy

#: The observation key a ``Text`` input reads when it names no ``info_key``.
PROMPT_KEY = "prompt"
#: The input name of the whole observation of a model without a spec.
WHOLE = adapt.WHOLE_OBS
#: Observation layouts kept compiled (least recently used evicted first).
MAX_LAYOUTS = 8
#: Layouts the model refused that are remembered (then refused up front).
MAX_REFUSED = 64
#: The keys a model without a spec reads its one array from in a dict.
STATE_KEYS = ("observation/state", "state", "obs")


class RequestError(ValueError):
    """A request the server cannot run, reported to its client only."""


class Leaf(NamedTuple):
    """One declared input: an array's shape and dtype (``float32[4]``)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


_INPUT = re.compile(r"^(?P<key>[^=]+)=(?P<dtype>\w+)\[(?P<dims>[\d,\s]*)\]$")


def parse_input(text: str) -> tuple[str, Leaf]:
    """``"KEY=DTYPE[D0,D1,...]"`` (``"x=float32[]"``: a scalar) as ``(key,
    Leaf)`` (ValueError: another form, or a dtype not of numbers or bools)."""
    m = _INPUT.match(text.strip()) if isinstance(text, str) else None
    form = (
        "expected KEY=DTYPE[SHAPE], e.g. observation/state=float32[8] or "
        "observation/image=uint8[224,224,3]"
    )
    if m is None:
        raise ValueError(f"input {text!r}: {form}")
    try:
        dtype = np.dtype(m["dtype"])
    except TypeError:
        raise ValueError(f"input {text!r}: no dtype {m['dtype']!r}; {form}") from None
    dims = [d for d in m["dims"].replace(" ", "").split(",") if d]
    return m["key"].strip(), _leaf(tuple(int(d) for d in dims), dtype, text)


def _leaf(shape: Any, dtype: Any, where: Any) -> Leaf:
    try:
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as e:
        raise ValueError(f"input {where!r}: {e}; expected (shape, dtype)") from None
    if dtype.kind not in "biuf" or any(d < 0 for d in shape):
        raise ValueError(
            f"input {where!r}: {dtype}{list(shape)}; expected an array of numbers "
            "or bools with dims >= 0"
        )
    return Leaf(shape, np.dtype(jax.dtypes.canonicalize_dtype(dtype)))


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes the forward is compiled for: 1, 2, 4, ... below
    ``max_batch``, and ``max_batch``."""
    return (*(1 << k for k in range((max_batch - 1).bit_length())), max_batch)


class Prepared(NamedTuple):
    """One request's inputs (name -> numpy pytree) and their layout."""

    inputs: dict
    signature: tuple


class Forward(NamedTuple):
    """Each row's output (``[K, *A]``), the padded batch size, the seconds."""

    outputs: list
    padded: int
    seconds: float


def _array(value: Any, where: str) -> np.ndarray:
    """``value`` as an array of numbers or bools in JAX's dtype."""
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


def _layout(inputs: dict, spec: Mapping[str, Any] | None) -> str:
    """A request's inputs in words, by observation key: ``observation/state
    float32[3], observation/image uint8[8,8,3]``."""
    keys = {n: getattr(d, "key", n) for n, d in (spec or {}).items()}

    def name(path: tuple) -> str:
        parts = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
        if parts:
            parts[0] = keys.get(parts[0], parts[0]) or WHOLE
        parts = [p for p in parts if p != WHOLE]
        return "][".join(parts) or "observation"

    leaves = jax.tree_util.tree_leaves_with_path(inputs)
    return ", ".join(f"{name(path)} {Leaf(x.shape, x.dtype)}" for path, x in leaves)


class ServedModel:
    """A model ready to serve (its ``load`` runs here; arguments as
    ``PolicyServer``'s). ValueError: it keeps state per episode, or a bad
    ``max_batch``."""

    def __init__(
        self,
        model: Any,
        *,
        max_batch: int,
        seed: int = 0,
        inputs: Mapping[str, Any] | None = None,
    ):
        ok = isinstance(max_batch, int) and not isinstance(max_batch, bool)
        if not ok or not 1 <= max_batch <= 4096:
            raise ValueError(
                f"max_batch={max_batch!r}: expected an int in [1, 4096] (the most "
                "requests one forward takes)"
            )
        pol = resolve_policy(model, with_params=False)
        why = []
        if pol.initial_state is not None:
            why.append("the model is recurrent (it defines initial_state)")
        for name, decl in (pol.spec or {}).items():
            if isinstance(decl, adapt.Previous):
                why.append(f"input {name!r} is Previous (the last executed action)")
            elif isinstance(decl, adapt.PendingChunk):
                why.append(
                    f"input {name!r} is PendingChunk (the previous chunk's tail)"
                )
            elif getattr(decl, "stack", 1) > 1:
                why.append(f"input {name!r} keeps a window of {decl.stack} frames")
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
        #: The declared inputs (observation key -> Leaf), or None.
        self.inputs = self._declared(inputs)
        #: The ``STATE_KEYS`` key a model without a spec reads its one array
        #: from, when declared, else None.
        self.array_key = None
        if pol.spec is None and self.inputs is not None and len(self.inputs) == 1:
            (key,) = self.inputs
            self.array_key = key if key in STATE_KEYS else None
        #: signature -> {batch size -> compiled forward}, least recently used
        #: first.
        self._programs: OrderedDict[tuple, dict[int, Any]] = OrderedDict()
        #: signature -> why it cannot run (the model refused those inputs).
        self._bad: OrderedDict[tuple, str] = OrderedDict()
        self._jit = jax.jit(self._forward)
        #: Whether the undeclared-chunk warning has been given.
        self._warned = False

    def _declared(self, inputs: Mapping[str, Any] | None) -> dict[str, Leaf] | None:
        """``inputs`` checked against what the spec reads."""
        if inputs is None:
            return None
        if not isinstance(inputs, Mapping) or not inputs:
            raise ValueError(
                f"inputs={inputs!r}: expected None or a non-empty dict from "
                "observation key to (shape, dtype), e.g. {'observation/state': "
                "((8,), 'float32')}"
            )
        out = {}
        for key, value in inputs.items():
            if isinstance(value, str):
                value = parse_input(f"{key}={value}")[1]
            elif hasattr(value, "shape") and hasattr(value, "dtype"):
                value = (value.shape, value.dtype)
            if not (isinstance(value, tuple) and len(value) == 2):
                raise ValueError(
                    f"inputs[{key!r}] = {value!r}: expected (shape, dtype), e.g. "
                    "((8,), 'float32')"
                )
            out[str(key)] = _leaf(value[0], value[1], key)
        reads = adapt.read_keys(self.policy.spec)
        if None not in reads:
            missing = [k for k in reads if k not in out]
            extra = [k for k in out if k not in reads]
            if missing or extra:
                raise ValueError(
                    f"inputs={sorted(out)}: policy {self.name!r} reads observation "
                    f"keys {reads}; declare each of them, and no other"
                    + (f" (missing {missing})" if missing else "")
                    + (f" (not read: {extra})" if extra else "")
                )
        return out

    def expects(self) -> str:
        """What a request must hold, in words (the start-up line says it)."""
        spec = self.policy.spec
        texts = [
            f"{decl.info_key or PROMPT_KEY!r} (a string)"
            for decl in adapt.text_inputs(spec).values()
        ]
        if self.inputs is None:
            what = "the observation as the model takes it"
            if spec is not None:
                what = f"keys {[k for k in adapt.read_keys(spec) if k is not None]}"
            return f"{', '.join([what, *texts])} (shapes not declared)"
        leaves = [f"{k!r} {leaf}" for k, leaf in self.inputs.items()]
        if self.array_key is not None:
            others = [k for k in STATE_KEYS if k != self.array_key]
            leaves[0] += f" (or under {others[0]!r} or {others[1]!r}, or bare)"
        return ", ".join(leaves + texts)

    def example(self) -> dict | None:
        """A request of the declared inputs (zeros), or None."""
        if self.inputs is None:
            return None
        obs: dict[str, Any] = {
            k: np.zeros(leaf.shape, leaf.dtype) for k, leaf in self.inputs.items()
        }
        for decl in adapt.text_inputs(self.policy.spec).values():
            obs[decl.info_key or PROMPT_KEY] = "warm up"
        return obs

    def _checked(self, key: str, value: Any) -> np.ndarray:
        """``obs[key]`` as its declared leaf (if declared), or the reason it is not."""
        x = _array(value, f"observation[{key!r}]")
        if self.inputs is None:
            return x
        leaf = self.inputs[key]
        if x.shape != leaf.shape:
            raise RequestError(
                f"observation[{key!r}] has shape {x.shape}; policy {self.name!r} "
                f"expects {leaf} (shape {leaf.shape}): send arrays of that shape"
            )
        if x.dtype != leaf.dtype:
            if not np.can_cast(x.dtype, leaf.dtype, "same_kind"):
                raise RequestError(
                    f"observation[{key!r}] has dtype {x.dtype}; policy "
                    f"{self.name!r} expects {leaf} (dtype {leaf.dtype}): send "
                    f"{leaf.dtype} arrays"
                )
            x = x.astype(leaf.dtype)
        return x

    def _whole(self, obs: Any) -> Any:
        """The whole observation, as a model without a spec (or a ``State``
        of ``key=None``) reads it."""
        if self.inputs is None:  # the model takes what is sent
            return _arrays_of(obs, "the observation")
        if self.array_key is not None:
            if not isinstance(obs, Mapping):
                return self._checked(self.array_key, obs)
            given = [k for k in STATE_KEYS if k in obs]
            if len(given) != 1:
                why = "holds none of" if not given else f"holds {given}, several of"
                raise RequestError(
                    f"the observation {why} the keys {list(STATE_KEYS)}; policy "
                    f"{self.name!r} reads one array ({self.inputs[self.array_key]}): "
                    "send it under one of them (its keys are "
                    f"{sorted(map(str, obs))})"
                )
            return self._checked(self.array_key, obs[given[0]])
        if not isinstance(obs, Mapping):
            raise RequestError(
                f"the observation is a {type(obs).__name__}; policy {self.name!r} "
                f"expects a dict of {self.expects()}"
            )
        missing = [k for k in self.inputs if k not in obs]
        if missing:
            raise RequestError(
                f"the observation lacks keys {missing}; policy {self.name!r} "
                f"expects {self.expects()}"
            )
        return {k: self._checked(k, obs[k]) for k in self.inputs}

    def prepare(self, obs: Any) -> Prepared:
        """One raw observation as the forward's inputs (numpy, on the host).

        Raises:
          RequestError: a key the spec reads is missing, a leaf is not an
            array of numbers, a leaf's shape or dtype is not the declared
            one, a Text's instruction is not a string, or the inputs have a
            layout the model already refused.
        """
        spec = self.policy.spec
        if spec is None:
            inputs = {WHOLE: self._whole(obs)}
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
                    inputs[name] = self._whole(obs)
                elif decl.key not in obs:
                    raise RequestError(
                        f"input {name!r} reads observation key {decl.key!r}, which "
                        f"this observation lacks; its keys are {sorted(map(str, obs))}"
                    )
                else:
                    inputs[name] = self._checked(decl.key, obs[decl.key])
        leaves, treedef = jax.tree.flatten(inputs)
        sig = treedef, tuple((x.shape, x.dtype.str) for x in leaves)
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

    def _program(self, sig: tuple, size: int, batch: dict, counters: Any) -> Any:
        programs = self._programs.get(sig)
        if programs is not None:
            self._programs.move_to_end(sig)
            if size in programs:
                return programs[size]
        program = self._jit.lower(self.params, batch, counters).compile()
        if programs is None:
            while len(self._programs) >= MAX_LAYOUTS:
                # JAX's own caches keep every layout's trace with no bound.
                self._programs.popitem(last=False)
                jax.clear_caches()
            programs = self._programs[sig] = {}
        programs[size] = program
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
        size = next(s for s in self.sizes if s >= n)  # the padded batch
        picked = [r.inputs for r in rows] + [rows[0].inputs] * (size - n)
        batch = jax.tree.map(lambda *xs: np.stack(xs), *picked)
        counters = np.arange(self._count, self._count + size, dtype=np.uint32)
        self._count += n
        batch = self.policy.place(batch)
        t0 = time.perf_counter()
        try:
            program = self._program(sig, size, batch, counters)
        except Exception as e:  # the model's own trace refused these inputs
            why = (
                f"policy {self.name!r} cannot run these inputs "
                f"({_layout(rows[0].inputs, self.policy.spec)}): "
                f"{type(e).__name__}: {e}"
            )
            if self.policy.spec is None and self.inputs is None:
                why += (
                    f". A model without a spec gets the observation as sent; one "
                    "that takes one array can be served with its inputs declared "
                    "(PolicyServer(inputs={'observation/state': ((N,), "
                    "'float32')}), serve-policy --input "
                    "observation/state=float32[N]), and clients then send it "
                    f"under one of {list(STATE_KEYS)}"
                )
            if sig not in self._programs:
                while len(self._bad) >= MAX_REFUSED:
                    self._bad.popitem(last=False)
                self._bad[sig] = why
            raise RequestError(why) from e
        out = np.asarray(jax.device_get(program(self.params, batch, counters)))
        seconds = time.perf_counter() - t0
        if not self.chunked and out.ndim >= 4 and not self._warned:
            # [B, 1, K, A]: most likely a chunk the model does not declare.
            self._warned = True
            warnings.warn(
                f"policy {self.name!r} returns actions of shape {out.shape[2:]} "
                "and declares no chunk, so each reply is a chunk of one "
                f"({out.shape[1:]}), which openpi's ActionChunkBroker cannot "
                "play; if it returns chunks of K actions, declare native_chunk=K "
                "(or a predict_chunk corner)",
                UserWarning,
                stacklevel=2,
            )
        return Forward([out[i] for i in range(n)], size, seconds)

    def warm_up(self, prepared: Prepared) -> None:
        """Compiles the forward for ``prepared``'s layout at every batch size
        (and runs each once), so that serving it compiles nothing."""
        for size in self.sizes:
            self.run([prepared] * size)

    def compiled(self) -> int:
        """How many programs are kept compiled (layouts x batch sizes)."""
        return sum(len(p) for p in self._programs.values())


__all__ = [
    "Forward",
    "Leaf",
    "MAX_LAYOUTS",
    "MAX_REFUSED",
    "PROMPT_KEY",
    "STATE_KEYS",
    "Prepared",
    "RequestError",
    "ServedModel",
    "batch_sizes",
    "parse_input",
]
