"""A run's language instruction: ``Starts(instruction=)``, or on a host-stepped
env each episode's reset info (``Text(info_key=)``, ``LaneTexts``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxmesh import adapt


def check_instruction(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(
        f"instruction={value!r}: expected one string (the language instruction "
        "every episode of the run gets) or None"
    )


def source(decl: adapt.Text, instruction: str | None) -> str:
    """Where a Text input's instruction comes from, in words."""
    if instruction is not None:
        return f"instruction {instruction!r}"
    if decl.info_key is not None:
        return f"from reset info key {decl.info_key!r}"
    return "none given"


def check_sources(
    spec: Mapping[str, Any] | None, instruction: str | None, env_name: str, host: bool
) -> dict[str, Any]:
    """Each Text input -> its encoded instruction (None: read from reset info)."""
    out: dict[str, Any] = {}
    for name, decl in adapt.text_inputs(spec).items():
        if instruction is not None:
            out[name] = decl.encoded(instruction)
        elif decl.info_key is not None and host:
            out[name] = None
        elif decl.info_key is not None:
            raise ValueError(
                f"input {name!r} (Text(info_key={decl.info_key!r})) reads each "
                f"episode's instruction from its reset info, but env {env_name!r} "
                "is a JAX env, which has none: pass evaluate(..., starts="
                "jaxmesh.Starts(instruction='...')) (CLI: instruction: in the YAML)"
            )
        else:
            raise ValueError(
                f"input {name!r} is a jaxmesh.adapt.Text but env {env_name!r} gets "
                "no instruction: pass evaluate(..., starts=jaxmesh.Starts("
                "instruction='...')) (CLI: instruction: in the YAML), or for a "
                "gymnasium or served env Text(encode, info_key='<reset info key>')"
            )
    return out


def lanes_of(encoded: Any, n: int) -> Any:
    """One encoding repeated for ``n`` lanes (numpy, ``[n, ...]`` leaves)."""
    return jax.tree.map(lambda x: np.broadcast_to(x, (n,) + x.shape).copy(), encoded)


class LaneTexts:
    """A host-stepped run's Text encodings per lane; one from the reset info
    changes when a lane ``begin``s an episode, and only then moves to the device."""

    def __init__(
        self, spec: Any, encoded: dict, n: int, device: Any = None, env_name: str = ""
    ):
        self.decls = adapt.text_inputs(spec)
        self.env_name, self.n = env_name, n
        self.per_episode = {k: d for k, d in self.decls.items() if encoded[k] is None}
        #: Reset-info keys to read at every reset.
        self.keys = tuple(dict.fromkeys(d.info_key for d in self.per_episode.values()))
        self.host: dict = {}
        for name, decl in self.decls.items():
            enc = encoded[name]
            if enc is None and decl.signature() is not None:
                enc = jax.tree.map(np.zeros_like, decl._cache[adapt._FIRST][1])
            if enc is not None:  # a per-episode one: zeros until a lane begins
                self.host[name] = lanes_of(enc, n)
        self.place = lambda tree: jax.device_put(tree, device)
        self._device: Any = None

    @property
    def missing(self) -> bool:
        """Some per-episode input has no encoding yet (a reset must come first)."""
        return any(name not in self.host for name in self.decls)

    def begin(self, js: list[int], texts: dict, episodes: list[int]) -> None:
        """Lanes ``js`` started ``episodes``; ``texts[key]``: their reset infos'."""
        if not self.per_episode:
            return
        for name, decl in self.per_episode.items():
            values = texts.get(decl.info_key, [None] * len(js))
            for j, i, value in zip(js, episodes, values, strict=True):
                if not isinstance(value, str):
                    what = (
                        "has no such key"
                        if value is None
                        else f"holds a {type(value).__name__} ({value!r})"
                    )
                    raise ValueError(
                        f"input {name!r}: the reset info of episode {i} (env "
                        f"{self.env_name!r}) {what}; Text(info_key="
                        f"{decl.info_key!r}) needs a string there. Make the env's "
                        "reset return info[key] = instruction, or pass "
                        "evaluate(..., starts=jaxmesh.Starts(instruction='...'))"
                    )
                enc = decl.encoded(str(value))
                if name not in self.host:
                    self.host[name] = lanes_of(jax.tree.map(np.zeros_like, enc), self.n)
                for dst, src in zip(
                    jax.tree.leaves(self.host[name]), jax.tree.leaves(enc), strict=True
                ):
                    dst[j] = src
        self._device = None

    def device(self) -> dict:
        if self._device is None:
            self._device = self.place(self.host)
        return self._device
