"""The backends of a run and what they share.

``config`` is the run's one checked configuration (``RunConfig`` and its
groups); ``backend`` tells which backend runs an env (scan, host, served);
``checks`` validates input before anything compiles; ``plan`` computes a run's
sizes once (effective horizon, lead, tile, capacity); ``build`` probes the
policy against the env and builds the engine. JAX envs: ``scan`` (the
``Evaluator`` and its one loop), ``placement`` and ``sharded`` (one device or
a mesh). Gymnasium envs: ``host``, ``host_agent`` and ``loop`` (the host loop,
in process or in worker processes) and ``served`` (served envs). Both:
``resume`` and ``identity`` (what a run is, and running only what an earlier
result lacks), ``stream`` (finished episodes to hooks, in order, kept on
failures), ``kept`` (what a second call reuses); ``pure`` is
``make_evaluator``. ``jaxmesh.api`` picks the backend and calls it.
"""
