"""The gymnasium envs' backend: the host steps the envs, the agent step is
jitted.

``driver`` builds a run's lanes (in this process, in worker processes or
served), its agent step and its metrics, and returns the ``RunResult``;
``agent_step`` is the jitted agent step on the host (``jaxmesh.make_agent``);
``loop`` is the one host loop over any kind of lanes; ``served`` paces the
loop over env servers (``"grpc://host:port"``).
"""

from jaxmesh.run.host.driver import clear_agents, run_host

__all__ = ["clear_agents", "run_host"]
