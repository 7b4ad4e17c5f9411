"""AutoGen AgentChat: each run of a team one ``pbkv serve`` workflow, each agent and the
selector named, ended when the run ends.

Needs ``autogen-agentchat`` and ``autogen-ext[openai]`` (the ``serve`` extra). AutoGen
never tells a model client which agent or which run calls it, and a team's clients are
fixed when the team is built, so :class:`WorkflowTeam` builds the team for each run from
a function given a client factory; ``client(name)`` returns an
``OpenAIChatCompletionClient`` whose requests carry ``X-PBKV-Workflow-Id: <this run>``
and ``X-PBKV-Agent: <name>``::

    def build(client):
        math = AssistantAgent("math_agent", model_client=client("math_agent"), tools=[add])
        writer = AssistantAgent("writer", model_client=client("writer"))
        return SelectorGroupChat([math, writer], model_client=client("selector"),
                                 termination_condition=TextMentionTermination("TERMINATE"))

    team = WorkflowTeam(build, base_url="http://127.0.0.1:8000/v1", model="tiny")
    result = await team.run(task="Add 2 and 3.")
    again = await team.run(task="Now 4 and 5.")     # a second workflow, same conversation

A run builds the team, loads the state the previous run left (so the conversation goes
on, as a reused AutoGen team's does; :meth:`WorkflowTeam.reset` starts afresh), runs it,
saves its state, closes the run's clients and ends the workflow (``POST
/v1/pbkv/workflows/{id}/end``) whether the run returned, raised or was abandoned. A
stream left before its end is an async generator: it ends when it is closed, so close it
(``async with contextlib.aclosing(team.run_stream(...)) as stream``) to end the workflow
and free the team for its next run at once, not when the garbage collector finalises it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from autogen_agentchat.base import TaskResult, Team
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

from pbkv.integrations.hints import end_workflow, hint_headers

log = logging.getLogger(__name__)

ClientFactory = Callable[[str], OpenAIChatCompletionClient]
"""``client(agent_name)``: a model client whose calls carry this run and that name."""

SERVED_MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=True,
    family=ModelFamily.UNKNOWN,
    structured_output=True,
)
"""What ``pbkv serve`` offers a client: tools and JSON/schema output, text only."""


def model_client(
    agent: str,
    *,
    workflow_id: str,
    base_url: str,
    model: str,
    api_key: str = "pbkv",
    model_info: ModelInfo | None = None,
    **kwargs: Any,
) -> OpenAIChatCompletionClient:
    """Return a model client whose every call is ``agent``'s in workflow ``workflow_id``.

    Args:
        agent: the name sent as ``X-PBKV-Agent`` (the agent's name, or ``selector``).
        workflow_id: sent as ``X-PBKV-Workflow-Id``.
        base_url: the server's OpenAI base URL (``http://HOST:PORT/v1``).
        model: the served model name (``GET /v1/models``).
        api_key: the API key (the tenant).
        model_info: what the model supports (default :data:`SERVED_MODEL_INFO`).
        **kwargs: passed to ``OpenAIChatCompletionClient`` (``temperature``,
            ``max_retries``...); its ``default_headers`` are kept beside the hints.
    """
    headers = {**(kwargs.pop("default_headers", None) or {}), **hint_headers(workflow_id, agent)}
    return OpenAIChatCompletionClient(
        model=model,
        base_url=base_url,
        api_key=api_key,
        model_info=model_info or SERVED_MODEL_INFO,
        default_headers=headers,
        **kwargs,
    )


class WorkflowTeam:
    """An AutoGen team run by ``pbkv serve`` as one workflow per run.

    Args:
        build: returns the team, given the run's :data:`ClientFactory`; called once per
            run. Every model client of the team (each agent's, a ``SelectorGroupChat``'s)
            should come from the factory, named as its agent.
        base_url: the server's OpenAI base URL (``http://HOST:PORT/v1``).
        model: the served model name.
        api_key: the API key (the tenant).
        model_info: what the model supports (default :data:`SERVED_MODEL_INFO`).
        **client_kwargs: passed to every ``OpenAIChatCompletionClient``.

    Attributes:
        team: the team of the current or last run (``None`` before the first).
        ended: the workflow ids the server confirmed ended, in order.
    """

    def __init__(
        self,
        build: Callable[[ClientFactory], Team],
        *,
        base_url: str,
        model: str,
        api_key: str = "pbkv",
        model_info: ModelInfo | None = None,
        **client_kwargs: Any,
    ) -> None:
        self._build = build
        self._base_url = base_url
        self._api_key = api_key
        self._client_kwargs = {"model": model, "model_info": model_info, **client_kwargs}
        self._state: Mapping[str, Any] | None = None
        self._running = False
        self.team: Team | None = None
        self.ended: list[str] = []

    async def run(
        self,
        *,
        task: str | BaseChatMessage | Sequence[BaseChatMessage] | None = None,
        workflow_id: str | None = None,
        **run_kwargs: Any,
    ) -> TaskResult:
        """Run the team on ``task`` as one workflow (``Team.run``); return its result.

        Args:
            task: the task (``None`` continues the previous run's conversation).
            workflow_id: the workflow's id (default: a fresh ``run-`` id).
            **run_kwargs: passed to ``Team.run_stream`` (``cancellation_token``...).

        Raises:
            RuntimeError: a run of this team is in progress.
        """
        result: TaskResult | None = None
        async for item in self.run_stream(task=task, workflow_id=workflow_id, **run_kwargs):
            if isinstance(item, TaskResult):
                result = item
        assert result is not None, "Team.run_stream ends with its TaskResult"
        return result

    async def run_stream(
        self,
        *,
        task: str | BaseChatMessage | Sequence[BaseChatMessage] | None = None,
        workflow_id: str | None = None,
        **run_kwargs: Any,
    ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | TaskResult, None]:
        """Run the team as one workflow, yielding what ``Team.run_stream`` yields (its
        ``TaskResult`` last). Arguments as :meth:`run`. Leaving it early: close it
        (``contextlib.aclosing``), or the run holds the team until it is finalised.

        Raises:
            RuntimeError: a run of this team is in progress.
        """
        if self._running:
            raise RuntimeError("a run of this team is in progress: runs are sequential")
        self._running = True
        workflow_id = workflow_id or f"run-{uuid.uuid4().hex}"
        clients: list[OpenAIChatCompletionClient] = []

        def client(agent: str) -> OpenAIChatCompletionClient:
            built = model_client(
                agent,
                workflow_id=workflow_id,
                base_url=self._base_url,
                api_key=self._api_key,
                **self._client_kwargs,
            )
            clients.append(built)
            return built

        try:
            self.team = team = self._build(client)
            if self._state is not None:
                await team.load_state(self._state)
            async for item in team.run_stream(task=task, **run_kwargs):
                yield item
            self._state = await team.save_state()
        finally:
            self._running = False
            await self._close(clients, workflow_id)

    async def _close(self, clients: list[OpenAIChatCompletionClient], workflow_id: str) -> None:
        """Close the run's clients and end its workflow (failures logged, not raised:
        a client that fails to close does not keep the others open or the workflow
        from ending)."""
        for built in clients:
            try:
                await built.close()
            except Exception:
                log.warning(
                    "closing a model client of workflow %s failed", workflow_id, exc_info=True
                )
        ended = await asyncio.to_thread(
            end_workflow, self._base_url, workflow_id, api_key=self._api_key
        )
        if ended:
            self.ended.append(workflow_id)

    async def reset(self) -> None:
        """Forget the conversation: the next run starts from a freshly built team."""
        if self._running:
            raise RuntimeError("a run of this team is in progress: reset after it ends")
        self._state = None
