"""The backends of a run and what they share: ``scan`` runs JAX envs, ``host``
gymnasium and served envs; ``config``, ``checks``, ``plan`` and ``build`` make
the run, ``stream`` and ``resume`` hand its episodes on (docs/architecture.md).
"""
