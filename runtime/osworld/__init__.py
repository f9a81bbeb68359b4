"""kvagent as an OSWorld agent: ``KvAgent`` (``agent``) deciding in this process (``local``)
or on a ``kvagent serve`` host (``remote`` over ``episode_client``), both behind one backend
protocol (``backend``); ``config`` sizes it before anything loads.

    from runtime.osworld import KvAgent
"""

from runtime.osworld.agent import KvAgent
from runtime.osworld.errors import AgentClosedError, AgentStepError, KvAgentError

__all__ = ["AgentClosedError", "AgentStepError", "KvAgent", "KvAgentError"]
