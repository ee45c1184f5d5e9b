"""Policies that the CLI tests name in their configs (``cli_policies:NAME``).

Importable because pytest puts ``tests/`` on ``sys.path``; a subprocess needs
``PYTHONPATH=tests``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jaxmesh
from jaxmesh.adapt import State


def tilt_fn(obs):
    """CartPole: push towards the side the pole leans to (short, varied episodes)."""
    return (obs[2] > 0).astype(jnp.int32)


#: A module-level Model instance (not callable, not a class).
tilt = jaxmesh.Model(tilt_fn, name="tilt")


def make_lean(index: int, name: str = "lean"):
    """A policy factory (``policy_config`` its arguments): push the way
    ``obs[index]`` leans (index 2, the pole's angle, is ``tilt_fn``)."""
    return jaxmesh.Model(lambda obs: (obs[index] > 0).astype(jnp.int32), name=name)


def make_nothing(index: int):
    """A function given policy_config that returns no policy."""
    return index


def three_args(obs, key, extra):
    """A policy function of the wrong arity (obs or obs, key are allowed)."""
    del key, extra
    return tilt_fn(obs)


#: Declares chunks of 4 actions; a horizon above 4 is refused.
chunked = jaxmesh.Model(
    lambda obs: jnp.repeat(tilt_fn(obs), 4), native_chunk=4, name="chunked"
)

#: Reads a window of the last 4 observations: 4 * 16 B = 64 B per CartPole lane.
stacked = jaxmesh.Model(
    lambda inputs: tilt_fn(inputs["obs"][-1]),
    spec={"obs": State(stack=4)},
    name="stacked",
)


def push(obs):
    """brax ``fast``: a 1-D action in [-1, 1]; the env never terminates."""
    return jnp.tanh(jnp.array([1.0 - obs[1]]))


class FailsAtRunTime(jaxmesh.Model):
    """Passes every check, then raises ValueError after its first episode."""

    def predict(self, obs):
        return tilt_fn(obs)

    def on_episode_end(self, episode_id: int) -> None:
        raise ValueError(f"failure while running, after episode {episode_id}")


class RemovesFolder(jaxmesh.Model):
    """``tilt``, and after its first episode the folder named by
    ``$JAXMESH_TEST_REMOVE`` is replaced by a file: a disk lost mid-run, after
    the output's folder was checked."""

    def predict(self, obs):
        return tilt_fn(obs)

    def on_episode_end(self, episode_id: int) -> None:
        import os
        import shutil

        folder = os.environ.get("JAXMESH_TEST_REMOVE")
        if folder and os.path.isdir(folder):
            shutil.rmtree(folder)
            with open(folder, "w") as f:
                f.write("not a folder any more\n")


def tilt_np(obs):
    """``tilt_fn`` in numpy over a batch of rows, for ``host: true``."""
    return (np.asarray(obs)[:, 2] > 0).astype(np.int64)


#: The same as a ``jaxmesh.HostPolicy`` instance (no ``host:`` key needed).
tilt_host = jaxmesh.HostPolicy(tilt_np, name="tilt_host")
