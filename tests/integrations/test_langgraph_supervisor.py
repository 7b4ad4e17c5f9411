"""A real LangGraph supervisor over two ``create_react_agent`` workers with tools, served
by ``pbkv serve`` on 127.0.0.1 (sim engine, replies scripted by agent and history).

The app changes two lines: :func:`pbkv.integrations.langchain.chat_model` for its model,
and :class:`~pbkv.integrations.langchain.WorkflowEnds` in the run's callbacks. Each run
must be one workflow (the thread, or the root run without one) whose agents are the
supervisor's and the workers' names, ended by the hook, with its tool calls
round-tripping and later calls served from cache.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from pbkv.integrations.langchain import WorkflowEnds, chat_model
from pbkv.live.chat import tool_call_text
from pbkv.server import ServerConfig
from pbkv.server.toolcalls import ReplyContext
from tests.server.conftest import serving

create_react_agent = pytest.importorskip("langgraph.prebuilt").create_react_agent
create_supervisor = pytest.importorskip("langgraph_supervisor").create_supervisor

ORDER = ("math_expert", "research_expert")  # the supervisor hands off to each in turn
WORKER_TOOL = {
    "math_expert": ("add", {"a": 2, "b": 3}),
    "research_expert": ("search", {"query": "pbkv"}),
}


def _calls(ctx: ReplyContext) -> list[str]:
    """Names of the tool calls in the request's history, in order."""
    return [c["function"]["name"] for m in ctx.messages for c in m.get("tool_calls") or ()]


def script(ctx: ReplyContext) -> str:
    """What each agent says: the supervisor hands off to each worker once, then answers;
    a worker calls its tool, then answers with the result."""
    if ctx.agent == "supervisor":
        handed = [n for n in _calls(ctx) if n.startswith("transfer_to_")]
        if len(handed) < len(ORDER):
            return tool_call_text(f"transfer_to_{ORDER[len(handed)]}", {})
        return "Both experts answered. Done."
    name, arguments = WORKER_TOOL[ctx.agent]
    calls = _calls(ctx)
    if calls and calls[-1] == name:  # its own tool has answered
        return f"{ctx.agent} found: {ctx.messages[-1]['content']}"
    return tool_call_text(name, arguments)


def build_app(llm: Any, seen: list[tuple[str, dict]], checkpointer: Any = None) -> Any:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append(("add", {"a": a, "b": b}))
        return a + b

    @tool
    def search(query: str) -> str:
        """Search the web."""
        seen.append(("search", {"query": query}))
        return f"{query} is a KV cache manager"

    math = create_react_agent(llm, [add], name="math_expert", prompt="You add numbers.")
    research = create_react_agent(llm, [search], name="research_expert", prompt="You search.")
    graph = create_supervisor([math, research], model=llm, prompt="You manage two experts.")
    return graph.compile(checkpointer=checkpointer)


AGENTS = ["supervisor", "math_expert", "supervisor", "research_expert", "supervisor"]


async def test_a_supervisor_over_react_agents_is_one_workflow_per_run_ended_by_the_hook():
    config = ServerConfig(port=0, reply_source=script)
    async with serving(config, engine="sim") as served:
        base_url = served.server.address.base_url
        llm = chat_model(base_url=base_url, model=served.runtime.model_name, max_retries=0)
        hook = WorkflowEnds(base_url=base_url)
        seen: list[tuple[str, dict]] = []

        def run() -> tuple[dict, dict]:
            threaded = build_app(llm, seen, InMemorySaver())
            config = {"configurable": {"thread_id": "t1"}, "callbacks": [hook]}
            first = threaded.invoke(
                {"messages": [HumanMessage("Add 2 and 3, look up pbkv.")]}, config
            )
            plain = build_app(llm, seen)  # no checkpointer, no thread: the root run's id
            second = plain.invoke({"messages": [HumanMessage("Again.")]}, {"callbacks": [hook]})
            return first, second

        first, second = await served.run(run)
        records = served.server.sessions.records()

    assert seen == [("add", {"a": 2, "b": 3}), ("search", {"query": "pbkv"})] * 2
    for state in (first, second):  # the workers' last messages carry their tools' results
        said = [
            m.content
            for m in state["messages"]
            if isinstance(m, AIMessage)
            and m.content
            and not m.response_metadata.get("__is_handoff_back")
        ]
        assert said == [
            "math_expert found: 5",
            "research_expert found: pbkv is a KV cache manager",
            "Both experts answered. Done.",
        ]
        handoffs = [m.name for m in state["messages"] if isinstance(m, ToolMessage)]
        assert handoffs[:2] == ["transfer_to_math_expert", "transfer_back_to_supervisor"]
    assert [r.workflow_id for r in records][0] == "t1"
    assert re.fullmatch(r"[0-9a-f-]{36}", records[1].workflow_id)  # the root run's id
    assert len(records) == 2 and hook.ended == [r.workflow_id for r in records]
    for record in records:
        assert (record.agents, record.requests, record.state) == (AGENTS, 7, "ended")
    replies = [m for m in first["messages"] if isinstance(m, AIMessage) and m.usage_metadata]
    cached = [m.usage_metadata["input_token_details"].get("cache_read", 0) for m in replies]
    assert len(cached) == 5 and cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
