"""Device values: ``None``, a ``jax.Device``, or a string such as ``'gpu:1'``.

One resolver for every place that takes a ``device=`` (``jaxmesh.Model``,
``jaxmesh.load_params``), so that they accept and refuse the same values with
the same messages. It imports nothing from jaxmesh, so any module can use it.
"""

from __future__ import annotations

from typing import Any

import jax

# Platform aliases jax.devices() does not take as they are.
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def check_device(value: Any, who: str) -> Any:
    """Checks the type of a ``device`` value without looking for the device.

    Args:
      value: None, a ``jax.Device``, or a string such as ``'cpu'`` or ``'gpu:1'``.
      who: what took the value, for the message (e.g. a model's name).

    Returns:
      ``value`` as it is.

    Raises:
      TypeError: any other type.
    """
    if value is None or isinstance(value, str | jax.Device):
        return value
    raise TypeError(
        f"{who}: device={value!r} must be None, a jax.Device, or a string such as "
        "'cpu', 'gpu' or 'gpu:1'"
    )


def resolve_device(device: Any, who: str = "device") -> jax.Device | None:
    """A ``device`` value as a ``jax.Device`` (None stays None: the default).

    Args:
      device: None, a ``jax.Device``, or ``'PLATFORM'`` / ``'PLATFORM:INDEX'``
        (``'cpu'``, ``'gpu'``, ``'gpu:1'``; ``'cuda'`` and ``'rocm'`` mean
        ``'gpu'``).
      who: what took the value, for the message (e.g. ``'load_params'``).

    Returns:
      The device, or None for None.

    Raises:
      TypeError: ``device`` is none of the types above.
      ValueError: a malformed string, or this machine has no such device (the
        message lists the devices there are).

    Example::

      resolve_device("cpu:0")  # CpuDevice(id=0)
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


__all__ = ["check_device", "resolve_device"]
