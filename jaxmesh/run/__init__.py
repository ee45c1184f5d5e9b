"""The host side of a run: checks, the backend, the plan, build, the loops.

``checks`` validates input before anything compiles; ``backend`` tells which
backend runs an env (scan, host, served) and checks the served-only options
once; ``plan`` computes a run's sizes once (effective horizon, lead, tile,
capacity); ``build`` probes the policy against the env and builds the engine;
``placement`` is where the lanes run (one device or a mesh, ``sharded`` holding
the mesh's mechanics); ``scan`` is ``jaxmesh.evaluate`` (it chooses the
backend) and the ``Evaluator`` with its one loop over JAX envs; ``host`` and
``served`` are the host loop over gymnasium envs, in process or served;
``stream`` hands finished episodes to hooks in order and keeps them on
failures; ``results`` turns the engine's results pytree into ``RunResult``;
``pure`` and ``agent`` are ``make_evaluator`` and ``make_agent``.
"""
