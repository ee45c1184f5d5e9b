"""The gymnasium envs' backend: the host steps the envs, the agent step is
jitted. ``driver`` builds a run, ``agent_step`` is the agent step
(``jaxmesh.make_agent``), ``loop`` the host loop, ``served`` its pace over
env servers.
"""

from jaxmesh.run.host.driver import clear_agents, run_host

__all__ = ["clear_agents", "run_host"]
