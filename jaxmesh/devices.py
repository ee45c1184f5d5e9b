"""One resolver for every place that takes a ``device`` (``resolve_device``) or
the ``devices=`` of a sharded run (``resolve_mesh``), so that all accept and
refuse the same values alike. It imports nothing from jaxmesh.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

# Platform aliases jax.devices() does not take as they are.
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def check_device(value: Any, who: str) -> Any:
    """``value`` when it is None, a ``jax.Device`` or a string (not looked
    for); else a TypeError naming ``who`` took it."""
    if value is None or isinstance(value, str | jax.Device):
        return value
    raise TypeError(
        f"{who}: device={value!r} must be None, a jax.Device, or a string such as "
        "'cpu', 'gpu' or 'gpu:1'"
    )


def resolve_device(device: Any, who: str = "device") -> jax.Device | None:
    """``device`` (None, a ``jax.Device``, or ``'PLATFORM'`` /
    ``'PLATFORM:INDEX'``: ``'gpu:1'``; ``'cuda'`` and ``'rocm'`` are ``'gpu'``)
    as a ``jax.Device`` (None stays None); ``who`` took it, for the message.

    Raises:
      TypeError: another type.
      ValueError: a malformed string, or this machine has no such device.
    """
    if device is None or isinstance(device, jax.Device):
        return device
    check_device(device, who)
    platform, _, index = device.strip().lower().partition(":")
    platform = _ALIASES.get(platform, platform)
    if index and not index.isdigit():
        raise ValueError(
            f"{who}: device={device!r}; expected 'PLATFORM' or 'PLATFORM:INDEX' "
            "(e.g. 'gpu:1'); the index must be an int"
        )
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        devices = []
    i = int(index or 0)
    if i >= len(devices):
        raise ValueError(
            f"{who}: device={device!r}, but this machine has {len(devices)} "
            f"{platform} device(s); available devices are "
            f"{[str(d) for d in jax.devices()]}. Pick one of them, or device=None "
            "for the default"
        )
    return devices[i]


#: The axis name of the mesh ``resolve_mesh`` builds.
LANE_AXIS = "lanes"


def resolve_mesh(devices: Any, who: str = "devices") -> Mesh | None:
    """``devices`` as a one-axis ``jax.sharding.Mesh`` (its axis ``LANE_AXIS``
    unless one was given): None (one device, no sharding) stays None;
    ``"all"``: every device JAX sees (every process's under
    ``jax.distributed``); an int D: the first D; a list of ``jax.Device``; a
    one-axis mesh.

    Raises:
      TypeError: another type.
      ValueError: a mesh with several axes, an empty list, a repeated device,
        or more devices than there are.
    """
    if devices is None or isinstance(devices, Mesh):
        if devices is not None and len(devices.axis_names) != 1:
            raise ValueError(
                f"{who}: a Mesh with axes {dict(devices.shape)}; expected one axis "
                "to split the lanes over. Build one with "
                "jax.sharding.Mesh(np.array(jax.devices()), ('lanes',))"
            )
        return devices
    every = jax.devices()
    if isinstance(devices, str):
        if devices.strip().lower() != "all":
            raise ValueError(
                f"{who}={devices!r}; expected 'all', an int, a list of jax.Device "
                "or a one-axis jax.sharding.Mesh (None: one device)"
            )
        chosen = list(every)
    elif isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
        if not 1 <= devices <= len(every):
            raise ValueError(
                f"{who}={devices}; expected 1 to {len(every)} (this machine has "
                f"{[str(d) for d in every]}). Pass 'all' for every device"
            )
        chosen = list(every[: int(devices)])
    elif isinstance(devices, Sequence) and all(
        isinstance(d, jax.Device) for d in devices
    ):
        chosen = list(devices)
        if not chosen or len(set(chosen)) != len(chosen):
            raise ValueError(
                f"{who}={devices!r}: expected a non-empty list of distinct devices"
            )
    else:
        raise TypeError(
            f"{who}={devices!r}: expected None, 'all', an int, a list of "
            "jax.Device or a one-axis jax.sharding.Mesh"
        )
    return Mesh(np.array(chosen, dtype=object), (LANE_AXIS,))


def mesh_size(mesh: Mesh) -> int:
    """The number of devices along a one-axis mesh."""
    return int(mesh.devices.size)


def check_local_share(mesh: Mesh, who: str = "devices") -> Mesh:
    """``mesh``, refused (ValueError) when no device of it belongs to this
    process (under ``jax.distributed`` each drives its own)."""
    me = jax.process_index()
    if any(d.process_index == me for d in mesh.devices.flat):
        return mesh
    owners = sorted({d.process_index for d in mesh.devices.flat})
    raise ValueError(
        f"{who}: the mesh's {mesh.devices.size} device(s) belong to process(es) "
        f"{owners}, none to this process ({me} of {jax.process_count()}); each "
        "process drives its own devices. Pass devices='all' (every process's "
        "devices), or call evaluate only in the processes that own the mesh"
    )


def host_device() -> jax.Device:
    """This process's first CPU device (else its first device): where
    host-built arrays wait before they are placed."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu
        return jax.local_devices()[0]
