"""The real OpenAI Agents SDK against ``pbkv serve`` on 127.0.0.1, changing only its
base URL (the SDK's default Responses API, its default model name served as an alias):
a triage agent hands off to an agent with a tool and an ``output_type`` (sim engine,
replies scripted by agent and history). The run is one workflow, each agent named,
ended when the run ends, with the tool call round-tripping and later calls cached."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel

from pbkv.live.chat import tool_call_text
from pbkv.server import ServerConfig
from pbkv.server.toolcalls import ReplyContext
from tests.server.conftest import serving

agents = pytest.importorskip("agents")


class Answer(BaseModel):
    total: int
    note: str


def script(ctx: ReplyContext) -> str:
    if ctx.agent == "triage":
        return tool_call_text("transfer_to_math_agent", {})
    last = ctx.messages[-1]
    calls = [c["function"]["name"] for m in ctx.messages for c in m.get("tool_calls") or ()]
    if calls[-1] == "add" and last["role"] == "tool":
        return json.dumps({"total": int(last["content"]), "note": "added"})
    return tool_call_text("add", {"a": 2, "b": 3})


async def test_handoffs_a_tool_and_an_output_type_with_only_the_base_url_changed():
    from openai import AsyncOpenAI

    from pbkv.integrations import openai_agents

    default_model = agents.models.get_default_model()
    config = ServerConfig(port=0, reply_source=script, model_aliases=(default_model,))
    async with serving(config, engine="sim") as served:
        base_url = served.server.address.base_url
        added: list[tuple[int, int]] = []

        @agents.function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            added.append((a, b))
            return a + b

        math = agents.Agent(name="math_agent", tools=[add], output_type=Answer)
        triage = agents.Agent(name="triage", handoffs=[math])

        def run() -> object:
            agents.set_tracing_disabled(True)
            client = AsyncOpenAI(base_url=base_url, api_key="pbkv", max_retries=0, timeout=60)
            agents.set_default_openai_client(client, use_for_tracing=False)
            return asyncio.run(
                openai_agents.run(triage, "What is 2 + 3?", base_url=base_url, workflow_id="sdk-1")
            )

        result = await served.run(run)
        [record] = served.server.sessions.records()
    assert result.final_output == Answer(total=5, note="added")
    assert result.last_agent.name == "math_agent" and added == [(2, 3)]
    assert (record.workflow_id, record.state) == ("sdk-1", "ended")
    assert (record.agents, record.requests) == (["triage", "math_agent"], 3)
    usage = [r.usage for r in result.raw_responses]
    cached = [u.input_tokens_details.cached_tokens for u in usage]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
