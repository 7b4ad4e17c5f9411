"""A real CrewAI crew whose agent uses a tool, served by ``pbkv serve`` on 127.0.0.1 (sim
engine, replies scripted by agent and history).

Runs in CrewAI's own virtualenv (``scripts/setup_crewai.sh``: CrewAI pins ``openai<3``),
started by ``tests/integrations/test_crewai.py``; its name keeps the main suite from
collecting it. The app changes one line, its LLM
(:func:`pbkv.integrations.crewai.llm`). Each kickoff must be one workflow whose agents
are the crew's roles, ended by the kickoff hook, with the tool call round-tripping and
later calls served from cache.
"""

from __future__ import annotations

import threading
from typing import Any

from crewai import Agent, Crew, Process, Task
from crewai.events import LLMCallCompletedEvent, crewai_event_bus
from crewai.tools import tool

from pbkv.integrations import crewai as pbkv_crewai
from pbkv.live.chat import tool_call_text
from pbkv.server import ServerConfig
from pbkv.server.toolcalls import ReplyContext
from tests.server.conftest import serving

ROLES = ["Researcher", "Writer"]


def script(ctx: ReplyContext) -> str:
    """The researcher calls ``search`` and answers with its result; the writer writes."""
    last = ctx.messages[-1]
    if ctx.agent == "Researcher":
        if last["role"] == "tool":
            return f"Found: {last['content']}"
        return tool_call_text("search", {"query": "pbkv"})
    return "Report: pbkv is a KV cache manager."


class Usage:
    """The ``usage`` of each LLM call CrewAI reported (its events), in order."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, source: Any, event: LLMCallCompletedEvent) -> None:
        with self._lock:
            self.calls.append(event.usage or {})


def build_crew(llm: Any, searched: list[str]) -> Crew:
    @tool("search")
    def search(query: str) -> str:
        """Search the web for a query."""
        searched.append(query)
        return f"{query} is a KV cache manager"

    researcher = Agent(
        role="Researcher",
        goal="Find facts about {topic}.",
        backstory="You look things up.",
        tools=[search],
        llm=llm,
        max_iter=3,
    )
    writer = Agent(role="Writer", goal="Write about {topic}.", backstory="You write.", llm=llm)
    research = Task(description="Look up {topic}.", expected_output="A fact.", agent=researcher)
    report = Task(
        description="Write a report on {topic}.", expected_output="A report.", agent=writer
    )
    return Crew(agents=[researcher, writer], tasks=[research, report], process=Process.sequential)


async def test_a_crew_whose_agent_uses_a_tool_is_one_workflow_per_kickoff_ended_by_the_hook():
    config = ServerConfig(port=0, reply_source=script)
    async with serving(config, engine="sim") as served:
        base_url = served.server.address.base_url
        llm = pbkv_crewai.llm(
            base_url=base_url, model=served.runtime.model_name, max_retries=0, timeout=60
        )
        searched: list[str] = []
        usage = Usage()
        crewai_event_bus.on(LLMCallCompletedEvent)(usage)
        crew = build_crew(llm, searched)

        def kickoff_twice() -> list[Any]:
            outputs = [crew.kickoff(inputs={"topic": "pbkv"}) for _ in range(2)]
            crewai_event_bus.flush()
            return outputs

        outputs = await served.run(kickoff_twice)
        records = served.server.sessions.records()

    assert searched == ["pbkv", "pbkv"]
    for output in outputs:
        assert [t.raw for t in output.tasks_output] == [
            "Found: pbkv is a KV cache manager",
            "Report: pbkv is a KV cache manager.",
        ]
    assert len(records) == 2 and records[0].workflow_id != records[1].workflow_id
    assert pbkv_crewai.KICKOFFS.ended == [r.workflow_id for r in records]
    for record in records:
        assert (record.agents, record.requests, record.state) == (ROLES, 3, "ended")
    # Calls: researcher (tool call), researcher (answer), writer; twice. On a fresh server
    # the writer's first prompt shares no whole block with the researcher's ("You are
    # Writer." vs "You are Researcher."); every other call starts with cached blocks, the
    # second kickoff's from the first's (retired at its end, not dropped).
    cached = [u.get("cached_prompt_tokens", 0) for u in usage.calls]
    assert len(cached) == 6 and cached[0] == cached[2] == 0, cached
    assert all(c > 0 for i, c in enumerate(cached) if i not in (0, 2)), cached
