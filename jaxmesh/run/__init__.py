"""A run's backends (``scan``: JAX envs; ``host``: gymnasium and served envs) and
what they share (docs/architecture.md)."""
