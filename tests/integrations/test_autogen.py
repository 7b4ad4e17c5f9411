"""A real AutoGen AgentChat ``SelectorGroupChat`` whose agents call tools, served by
``pbkv serve`` on 127.0.0.1 (sim engine, replies scripted by agent and history).

The app builds its team in a function given a client factory
(:class:`pbkv.integrations.autogen.WorkflowTeam`). Two runs of the same team must be two
workflows whose agents are the selector's and the agents' names, each ended by the
wrapper, with the tool calls round-tripping and later calls served partly from cache.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest

from pbkv.live.chat import tool_call_text
from pbkv.server import ServerConfig
from pbkv.server.toolcalls import ReplyContext
from tests.server.conftest import serving

agentchat = pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.openai")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination  # noqa: E402
from autogen_agentchat.messages import TextMessage, ToolCallExecutionEvent  # noqa: E402
from autogen_agentchat.teams import SelectorGroupChat  # noqa: E402
from autogen_core import EVENT_LOGGER_NAME  # noqa: E402
from autogen_core.logging import LLMCallEvent  # noqa: E402

from pbkv.integrations.autogen import WorkflowTeam  # noqa: E402

ORDER = ("math_agent", "research_agent")  # the selector picks each in turn
AGENT_TOOL = {
    "math_agent": ("add", {"a": 2, "b": 3}),
    "research_agent": ("search", {"query": "pbkv"}),
}
AGENTS = ["selector", "math_agent", "selector", "research_agent"]  # /stats: each turn once


class Script:
    """What each agent says: the selector names each agent in turn (counted per
    workflow); an agent calls its tool, then answers with the result (the last answers
    ``TERMINATE``)."""

    def __init__(self) -> None:
        self.selections: Counter[str | None] = Counter()

    def __call__(self, ctx: ReplyContext) -> str:
        if ctx.agent == "selector":
            self.selections[ctx.workflow_id] += 1
            return ORDER[self.selections[ctx.workflow_id] - 1]
        name, arguments = AGENT_TOOL[ctx.agent]
        last = ctx.messages[-1]
        if last["role"] == "tool":  # its own tool has answered
            end = " TERMINATE" if ctx.agent == ORDER[-1] else ""
            return f"{ctx.agent} found: {last['content']}{end}"
        return tool_call_text(name, arguments)


class LLMCalls(logging.Handler):
    """The chat completions AutoGen's clients logged (their ``usage`` as served)."""

    def __init__(self) -> None:
        super().__init__()
        self.responses: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, LLMCallEvent):
            self.responses.append(record.msg.kwargs["response"])


async def test_a_selector_group_chat_with_tools_is_one_workflow_per_run_ended_by_the_wrapper():
    config = ServerConfig(port=0, reply_source=Script())
    async with serving(config, engine="sim") as served:
        base_url = served.server.address.base_url
        seen: list[tuple[str, dict]] = []

        async def add(a: int, b: int) -> int:
            """Add two integers."""
            seen.append(("add", {"a": a, "b": b}))
            return a + b

        async def search(query: str) -> str:
            """Search the web."""
            seen.append(("search", {"query": query}))
            return f"{query} is a KV cache manager"

        def build(client: Any) -> SelectorGroupChat:
            math = AssistantAgent(
                "math_agent",
                client("math_agent"),
                tools=[add],
                reflect_on_tool_use=True,
                description="Adds numbers.",
            )
            research = AssistantAgent(
                "research_agent",
                client("research_agent"),
                tools=[search],
                reflect_on_tool_use=True,
                description="Searches the web.",
            )
            done = TextMentionTermination("TERMINATE") | MaxMessageTermination(12)
            return SelectorGroupChat(
                [math, research],
                model_client=client("selector"),
                termination_condition=done,
                allow_repeated_speaker=True,
            )

        calls = LLMCalls()

        def run() -> list[Any]:
            events = logging.getLogger(EVENT_LOGGER_NAME)
            events.addHandler(calls)
            events.setLevel(logging.INFO)
            team = WorkflowTeam(
                build, base_url=base_url, model=served.runtime.model_name, max_retries=0, timeout=60
            )

            async def twice() -> list[Any]:
                first = await team.run(task="Add 2 and 3, then look up pbkv.")
                second = await team.run(task="Again, please.")
                return [first, second, team.ended]

            try:
                return asyncio.run(twice())
            finally:
                events.removeHandler(calls)

        first, second, ended = await served.run(run)
        records = served.server.sessions.records()

    assert seen == [("add", {"a": 2, "b": 3}), ("search", {"query": "pbkv"})] * 2
    for result in (first, second):
        said = [(m.source, m.content) for m in result.messages if isinstance(m, TextMessage)]
        assert said[1:] == [
            ("math_agent", "math_agent found: 5"),
            ("research_agent", "research_agent found: pbkv is a KV cache manager TERMINATE"),
        ]
        executed = [e for e in result.messages if isinstance(e, ToolCallExecutionEvent)]
        assert [r.content for e in executed for r in e.content] == [
            "5",
            "pbkv is a KV cache manager",
        ]
    assert len(records) == 2 and ended == [r.workflow_id for r in records]
    assert records[0].workflow_id != records[1].workflow_id
    for record in records:
        assert (record.agents, record.requests, record.state) == (AGENTS, 6, "ended")
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in calls.responses]
    # On a fresh server the selector's first prompt (no system message: the template's
    # default) and the math agent's first (AutoGen's system message) share no block;
    # every later call, the second run's first included, starts with cached blocks.
    assert len(cached) == 12 and cached[:2] == [0, 0], cached
    assert all(c > 0 for c in cached[2:]), cached


def test_a_client_that_fails_to_close_does_not_keep_the_workflow_open(monkeypatch, caplog):
    """``_close`` logs a failing ``close()`` and still closes the others and ends the
    workflow."""
    import pbkv.integrations.autogen as autogen

    closed: list[str] = []

    class Client:
        def __init__(self, name: str, fails: bool) -> None:
            self.name, self.fails = name, fails

        async def close(self) -> None:
            if self.fails:
                raise OSError("socket gone")
            closed.append(self.name)

    ended: list[str] = []
    monkeypatch.setattr(
        autogen, "end_workflow", lambda url, wid, api_key: ended.append(wid) or True
    )
    team = WorkflowTeam(lambda client: None, base_url="http://127.0.0.1:1/v1", model="m")
    clients = [Client("a", True), Client("b", False)]
    with caplog.at_level(logging.WARNING, logger="pbkv.integrations.autogen"):
        asyncio.run(team._close(clients, "wf-1"))  # type: ignore[arg-type]
    assert closed == ["b"] and ended == ["wf-1"] and team.ended == ["wf-1"]
    assert "closing a model client of workflow wf-1 failed" in caplog.text
