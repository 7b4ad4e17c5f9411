"""CrewAI: each crew kickoff one ``pbkv serve`` workflow, each agent named by its role,
ended when the kickoff ends.

Needs ``crewai`` (1.15; not in the ``serve`` extra: CrewAI pins ``openai<3``, the Agents
SDK there needs ``openai>=3``; ``scripts/setup_crewai.sh`` makes its own virtualenv). An
app changes the line that makes its LLM::

    llm = pbkv.integrations.crewai.llm(base_url="http://127.0.0.1:8000/v1", model="tiny")
    crew = Crew(agents=[Agent(role="Researcher", llm=llm, tools=[...], ...)], tasks=[...])
    crew.kickoff(inputs={...})

:class:`WorkflowLLM` is CrewAI's own OpenAI-compatible LLM (``OpenAICompletion``, chat
completions by default) whose every call carries ``{"pbkv": {"workflow_id": <this
kickoff>, "agent": <the calling agent's role>}}`` in its body. The kickoff's id comes
from :data:`KICKOFFS`, a pair of CrewAI execution hooks (``EXECUTION_START`` /
``EXECUTION_END``, registered process-wide when the first :class:`WorkflowLLM` is made):
each kickoff of a crew gets a fresh ``crew-`` id, and when the kickoff returns or raises
its workflow is ended (``POST /v1/pbkv/workflows/{id}/end``) on each server its calls
used. A call from no crew's agent (a standalone ``Agent.kickoff``, a bare ``llm.call``)
carries only the agent, if any: a one-request workflow.
"""

from __future__ import annotations

import contextvars
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from crewai.hooks import InterceptionPoint, register_hook, unregister_hook
from crewai.llms.providers.openai.completion import OpenAICompletion

from pbkv.integrations.hints import end_workflow, hint_body

AGENT_NAME_CHARS = 256
"""The longest agent name the server takes (``X-PBKV-Agent``, ``pbkv.agent``)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A server a kickoff's calls used, and how to end a workflow there."""

    base_url: str
    api_key: str


@dataclass(slots=True)
class Kickoff:
    """One kickoff of a crew: its workflow id and the servers its calls reached."""

    workflow_id: str
    endpoints: dict[Endpoint, None] = field(default_factory=dict)


class Kickoffs:
    """The workflow of each crew kickoff in flight, opened and ended by CrewAI's
    execution hooks.

    Crew kickoffs are not reentrant on one crew (``kickoff_for_each`` copies it), so a
    crew's id names its kickoff in flight. Thread-safe: async tasks run in threads.

    Attributes:
        ended: the workflow ids the server confirmed ended, in order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Kickoff] = {}  # crew id → its kickoff in flight
        self._installed = False
        self.ended: list[str] = []

    def install(self) -> None:
        """Register the hooks (process-wide; idempotent)."""
        with self._lock:
            if self._installed:
                return
            register_hook(InterceptionPoint.EXECUTION_START, self._started)
            register_hook(InterceptionPoint.EXECUTION_END, self._finished)
            self._installed = True

    def uninstall(self) -> None:
        """Unregister the hooks; kickoffs in flight then end by the idle timeout."""
        with self._lock:
            unregister_hook(InterceptionPoint.EXECUTION_START, self._started)
            unregister_hook(InterceptionPoint.EXECUTION_END, self._finished)
            self._installed = False

    def workflow_of(self, crew: Any, endpoint: Endpoint) -> str | None:
        """Return the workflow of ``crew``'s kickoff in flight (``None``: none), and
        record that it used ``endpoint`` (where it is ended)."""
        with self._lock:
            kickoff = self._open.get(str(crew.id)) if crew is not None else None
            if kickoff is None:
                return None
            kickoff.endpoints[endpoint] = None
            return kickoff.workflow_id

    def _started(self, ctx: Any) -> None:
        if ctx.crew is not None:
            with self._lock:
                self._open[str(ctx.crew.id)] = Kickoff(f"crew-{uuid.uuid4().hex}")

    def _finished(self, ctx: Any) -> None:
        if ctx.crew is None:
            return
        with self._lock:
            kickoff = self._open.pop(str(ctx.crew.id), None)
        for endpoint in kickoff.endpoints if kickoff is not None else ():
            if end_workflow(endpoint.base_url, kickoff.workflow_id, api_key=endpoint.api_key):
                self.ended.append(kickoff.workflow_id)


KICKOFFS = Kickoffs()
"""The process's kickoff hooks, installed by the first :class:`WorkflowLLM`."""

_HINTS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "pbkv_crewai_hints", default=None
)


def agent_name(agent: Any) -> str | None:
    """Return the name a CrewAI agent's calls carry: its role, whitespace collapsed (a
    YAML role often ends in a newline), at most :data:`AGENT_NAME_CHARS` characters."""
    role = getattr(agent, "role", None)
    if not role:
        return None
    return " ".join(str(role).split())[:AGENT_NAME_CHARS] or None


class WorkflowLLM(OpenAICompletion):
    """CrewAI's OpenAI-compatible LLM, each call hinted with its kickoff and agent.

    Takes ``OpenAICompletion``'s fields (``model``, ``base_url``, ``api_key``,
    ``temperature``, ``max_tokens``, ``api="responses"``...). Hints already in
    ``additional_params["extra_body"]["pbkv"]`` win.
    """

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        KICKOFFS.install()

    def _hints(self, from_agent: Any, from_task: Any) -> dict[str, Any]:
        agent = from_agent if from_agent is not None else getattr(from_task, "agent", None)
        endpoint = Endpoint(str(self.base_url or self.api_base), str(self.api_key))
        workflow_id = KICKOFFS.workflow_of(getattr(agent, "crew", None), endpoint)
        return hint_body(workflow_id, agent_name(agent))["pbkv"]

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        token = _HINTS.set(self._hints(kwargs.get("from_agent"), kwargs.get("from_task")))
        try:
            return super().call(messages, *args, **kwargs)
        finally:
            _HINTS.reset(token)

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        token = _HINTS.set(self._hints(kwargs.get("from_agent"), kwargs.get("from_task")))
        try:
            return await super().acall(messages, *args, **kwargs)
        finally:
            _HINTS.reset(token)

    def _with_hints(self, params: dict[str, Any]) -> dict[str, Any]:
        hints = _HINTS.get()
        if not hints:
            return params
        extra = dict(params.get("extra_body") or {})
        extra["pbkv"] = {**hints, **(extra.get("pbkv") or {})}
        return {**params, "extra_body": extra}

    def _prepare_completion_params(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._with_hints(super()._prepare_completion_params(*args, **kwargs))

    def _prepare_responses_params(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._with_hints(super()._prepare_responses_params(*args, **kwargs))


def llm(*, base_url: str, model: str, api_key: str = "pbkv", **kwargs: Any) -> WorkflowLLM:
    """Return an LLM for ``pbkv serve`` at ``base_url`` (``http://HOST:PORT/v1``).

    Args:
        base_url: the server's OpenAI base URL.
        model: the served model name (``GET /v1/models``).
        api_key: sent as ``Authorization: Bearer`` (the tenant).
        **kwargs: passed to :class:`WorkflowLLM` (``temperature``, ``max_tokens``,
            ``timeout``, ``max_retries``...).
    """
    return WorkflowLLM(model=model, base_url=base_url, api_key=api_key, **kwargs)
