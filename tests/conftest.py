"""Shared test tools: the one way the suite checks whether XLA compiled."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import pytest

#: The event JAX records once per XLA (backend) compilation.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def compiles():
    """Collects the XLA compilations made inside the block (a list of names).

    Listens to ``jax.monitoring``'s backend-compile event, which JAX records for
    every program it hands to XLA (a persistent-cache hit included).
    """
    seen: list[str] = []

    def listen(event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            seen.append(str(kwargs.get("fun_name", "?")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture
def no_compile():
    """Fails the test if anything reaches XLA compilation inside it.

    Two one-time eager ops of the process are made first, so that the check is
    about the run's programs: ``jax.random.PRNGKey(0)`` (the shape probe builds
    one) and ``jnp.zeros(())`` (``Model`` asks whether it is under a trace).
    """
    jax.random.PRNGKey(0)
    jnp.zeros(())
    with compiles() as seen:
        yield
    assert not seen, f"compiled before rejecting bad input: {seen}"
