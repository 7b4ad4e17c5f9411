"""The OpenAI Agents SDK: one run, one ``pbkv serve`` workflow, each agent named.

Needs ``openai-agents``. The SDK reaches pbkv by its base URL alone (the Responses API,
``/v1/responses``)::

    agents.set_default_openai_client(AsyncOpenAI(base_url="http://127.0.0.1:8000/v1",
                                                 api_key="pbkv"))
    result = await pbkv.integrations.openai_agents.run(triage, "question",
                                                       base_url="http://127.0.0.1:8000/v1")

:func:`run` runs ``Runner.run`` on a copy of the agent and every agent it hands off to,
each with ``{"pbkv": {"workflow_id": run, "agent": its name}}`` in its
``ModelSettings.extra_body``, and ends the workflow when the run returns or raises (the
SDK has no run-end hook of its own). Handoffs given as plain agents are followed;
``handoff(...)`` objects and agents as tools keep their own settings (hint those agents
with :func:`with_hints` yourself).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

from agents import Agent, Runner

from pbkv.integrations.hints import end_workflow, hint_body


def with_hints(agent: Agent[Any], workflow_id: str) -> Agent[Any]:
    """Return a copy of ``agent`` (and of the agents it hands off to) whose calls carry
    ``workflow_id`` and the agent's own name. Does not modify ``agent``."""
    copies: dict[int, Agent[Any]] = {}

    def copy(original: Agent[Any]) -> Agent[Any]:
        if id(original) in copies:
            return copies[id(original)]
        settings = original.model_settings
        extra = {**(settings.extra_body or {}), **hint_body(workflow_id, original.name)}
        clone = original.clone(model_settings=dataclasses.replace(settings, extra_body=extra))
        copies[id(original)] = clone
        clone.handoffs = [copy(h) if isinstance(h, Agent) else h for h in original.handoffs]
        return clone

    return copy(agent)


async def run(
    agent: Agent[Any],
    input: Any,
    *,
    base_url: str,
    api_key: str = "pbkv",
    workflow_id: str | None = None,
    **runner_kwargs: Any,
) -> Any:
    """Run ``agent`` on ``input`` (``Runner.run``) as one workflow, ended when it ends.

    Args:
        agent: the starting agent.
        input: the run's input (text or input items).
        base_url: the server's OpenAI base URL (for the end of the workflow).
        api_key: the API key the SDK's client sends (the tenant).
        workflow_id: the workflow's id (default: a fresh ``run-`` id).
        **runner_kwargs: passed to ``Runner.run`` (``context``, ``max_turns``, ``hooks``...).

    Returns:
        The ``RunResult``.
    """
    workflow_id = workflow_id or f"run-{uuid.uuid4().hex}"
    try:
        return await Runner.run(with_hints(agent, workflow_id), input, **runner_kwargs)
    finally:
        await asyncio.to_thread(end_workflow, base_url, workflow_id, api_key=api_key)
