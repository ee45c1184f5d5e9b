"""The command line's switch of the persistent compilation cache."""

from __future__ import annotations

import os
import sys

from jaxmesh.cache import CACHE_DIR_ENV, enable_compile_cache
from jaxmesh.cli.errors import ConfigError

#: The environment variable that turns the cache off (0) or on (1, the default).
CACHE_SWITCH_ENV = "JAXMESH_COMPILE_CACHE"
_OFF = ("0", "false", "no", "off")


def compile_cache_wanted(flag_off: bool) -> bool:
    """Whether to use the cache: yes unless the flag or the variable says off."""
    raw = os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()
    if raw not in (*_OFF, "", "1", "true", "yes", "on"):
        raise ConfigError(
            f"{CACHE_SWITCH_ENV}={os.environ[CACHE_SWITCH_ENV]!r}: expected 0 or 1 "
            "(also false/true, no/yes, off/on); unset it to use the cache"
        )
    return not flag_off and raw not in _OFF


def use_compile_cache(flag_off: bool, command: str) -> None:
    """Turns the cache on when wanted; one that cannot be written only costs
    compile time (a warning)."""
    if not compile_cache_wanted(flag_off):
        return
    try:
        enable_compile_cache()
    except OSError as e:
        print(
            f"jaxmesh {command}: warning: compilation cache off ({e}); set "
            f"{CACHE_DIR_ENV} to a writable directory",
            file=sys.stderr,
        )
