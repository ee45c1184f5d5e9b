"""The host side of a run: checks, build, the scan host loop, streaming, results.

``checks`` validates input before anything compiles; ``build`` probes the policy
against the env and builds the engine; ``scan`` is ``jaxmesh.evaluate`` over JAX
envs (an ``Evaluator`` owns its compiled segments); ``stream`` hands finished
episodes to hooks in order and keeps them on failures; ``results`` turns the
engine's results pytree into ``RunResult``; ``pure`` and ``agent`` are
``make_evaluator`` and ``make_agent``.
"""
