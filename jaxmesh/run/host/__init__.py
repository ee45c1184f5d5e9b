"""The gymnasium envs' backend: the host steps the envs (``loop``; ``served``
over env servers), the agent step is jitted (``agent_step``); ``driver`` builds
a run."""

from jaxmesh.run.host.driver import clear_agents, run_host

__all__ = ["clear_agents", "run_host"]
