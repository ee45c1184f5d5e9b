"""The persistent compilation cache: compile a program once per machine
(docs/cli.md, "The persistent compilation cache")."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the cache directory.
CACHE_DIR_ENV = "JAXMESH_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$JAXMESH_CACHE_DIR``, else ``jaxmesh/xla`` in ``$XDG_CACHE_HOME``
    (default ``~/.cache``)."""
    explicit = os.environ.get(CACHE_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or "~/.cache"
    return Path(base).expanduser() / "jaxmesh" / "xla"


def enable_compile_cache(path: str | Path | None = None) -> Path:
    """Turns on JAX's persistent compilation cache for this process: every
    executable compiled from then on is written there, whatever its compile
    time or size. The cache is trusted code: do not point it at a directory
    others may write.

    Args:
      path: the cache directory (created if missing); None:
        ``default_cache_dir()``.

    Returns:
      The directory in use.

    Raises:
      OSError: the directory cannot be created.

    Example::

      jaxmesh.enable_compile_cache()  # then jaxmesh.evaluate(...) as usual
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    where = Path(path).expanduser() if path is not None else default_cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(where))
    # JAX's defaults keep only executables that took over 1 s to compile.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # JAX decides once per process whether the cache is used; start afresh.
    compilation_cache.reset_cache()
    return where
