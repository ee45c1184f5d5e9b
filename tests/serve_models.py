"""Small models for the serving tests, each with its reference computed in
numpy (independently of the server)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jaxmesh
from jaxmesh.adapt import Image, State

#: The weights of ``linear_model``: actions[k] = W[k] @ state + k.
W = np.linspace(-1.0, 1.0, 4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)


def linear_reference(state: np.ndarray) -> np.ndarray:
    """``linear_model``'s chunk for one state, in numpy: [4, 2]."""
    return np.stack([W[k] @ state + k for k in range(4)]).astype(np.float32)


def linear_model(key: str = "observation/state") -> jaxmesh.Model:
    """A chunked model (K = 4, A = 2) reading one state leaf by ``key``."""

    def chunk(inputs):
        x = inputs["state"]
        return jnp.einsum("kaj,j->ka", W, x) + jnp.arange(4.0)[:, None]

    return jaxmesh.Model(chunk, spec={"state": State(key=key)}, native_chunk=4)


class ImageModel(jaxmesh.Model):
    """openpi's LIBERO keys: an image resized to 8x8 and a state; a chunk of
    K = 5 actions of 3 (its reference: ``image_reference``)."""

    native_chunk = 5
    spec = {
        "image": Image(key="observation/image", size=(8, 8)),
        "state": State(key="observation/state"),
    }

    def predict_chunk(self, obs):
        feat = obs["image"].mean(axis=(0, 1))  # [3]
        return jnp.stack([feat * (k + 1) + obs["state"][:3] for k in range(5)])


def libero_obs(i: int, size: int = 16) -> dict:
    """An observation as openpi's LIBERO client sends it: flat keys with
    slashes, a uint8 camera image (each channel one value, so that any resize
    keeps it), a float state and a prompt."""
    colour = np.array([3 * i % 256, 40 + i % 200, 250 - i % 250], np.uint8)
    return {
        "observation/image": np.broadcast_to(colour, (size, size, 3)).copy(),
        "observation/wrist_image": np.zeros((size, size, 3), np.uint8),
        "observation/state": np.arange(8, dtype=np.float32) * 0.1 + i,
        "prompt": "put the bowl on the plate",
    }


def image_reference(obs: dict) -> np.ndarray:
    """``ImageModel``'s chunk for ``obs``, in numpy: [5, 3]."""
    feat = obs["observation/image"][0, 0].astype(np.float32) / 255.0
    state = obs["observation/state"][:3]
    return np.stack([feat * (k + 1) + state for k in range(5)]).astype(np.float32)


#: ``linear_model()`` as ``jaxmesh serve-policy serve_models:LINEAR`` names it.
LINEAR = linear_model()


def big_reply_model() -> jaxmesh.Model:
    """A chunk of 256 x 4096 float32 (4 MiB) per request: a reply a client
    that does not read cannot take in."""

    def chunk(inputs):
        return jnp.zeros((256, 4096), jnp.float32) + inputs["state"][0]

    return jaxmesh.Model(
        chunk, spec={"state": State(key="observation/state")}, native_chunk=256
    )


#: ``big_reply_model()`` as ``jaxmesh serve-policy serve_models:BIG_REPLY``
#: names it.
BIG_REPLY = big_reply_model()


def any_shape_model() -> jaxmesh.Model:
    """One action of 2, the sum of a state of any shape and its negation:
    every state shape is a layout it runs."""

    def act(inputs):
        total = inputs["state"].sum()
        return jnp.stack([total, -total])

    return jaxmesh.Model(act, spec={"state": State(key="observation/state")})


#: ``any_shape_model()`` as ``serve-policy serve_models:ANY_SHAPE`` names it.
ANY_SHAPE = any_shape_model()
