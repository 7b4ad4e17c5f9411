"""Tool calls and structured replies over HTTP (sim engine: replies scripted, or the
schema-valid replies the sim gives for required / named tool_choice and response_format)."""

from __future__ import annotations

import json
from typing import Any

import jinja2

from pbkv.live.chat import tool_call_text
from pbkv.server import ServerConfig
from pbkv.server.toolcalls import ReplyContext
from tests.server.conftest import Served, serving

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 5}},
            "required": ["a", "b"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
SAYS = "Adding, then searching.\n" + tool_call_text("add", {"a": 2, "b": 3}) + "\n"
SAYS += tool_call_text("search", {"query": "naïve"})


def script(ctx: ReplyContext) -> str | None:
    """Call both tools unless the last message is a tool's answer; then answer."""
    if ctx.messages[-1]["role"] == "tool":
        return f"The sum is {ctx.messages[-2]['content']}."
    return SAYS if ctx.plan.tools else None


def _serving(**config: Any):
    return serving(ServerConfig(port=0, reply_source=script, **config), engine="sim")


def _ask(served: Served, **body: Any) -> Any:
    client = served.client()
    body.setdefault("model", served.runtime.model_name)
    body.setdefault("messages", [{"role": "user", "content": "Add 2 and 3."}])
    return client.chat.completions.create(**body)


async def test_a_reply_with_tool_calls_has_them_parsed_and_finishes_by_tool_calls():
    async with _serving() as served:
        reply = await served.run(lambda: _ask(served, tools=[ADD, SEARCH]))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Adding, then searching."
    calls = [(c.type, c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert calls == [
        ("function", "add", '{"a": 2, "b": 3}'),
        ("function", "search", '{"query": "naïve"}'),
    ]
    assert len({c.id for c in choice.message.tool_calls}) == 2


async def test_streamed_tool_call_deltas_reassemble_to_the_whole_reply():
    async with _serving() as served:
        whole = await served.run(lambda: _ask(served, tools=[ADD, SEARCH]))

        def streamed() -> tuple[str, dict[int, list[str]], str | None]:
            content, calls, finish = "", {}, None
            for chunk in _ask(served, tools=[ADD, SEARCH], stream=True):
                delta = chunk.choices[0].delta
                content += delta.content or ""
                for call in delta.tool_calls or ():
                    parts = calls.setdefault(call.index, ["", "", ""])
                    parts[0] += call.id or ""
                    parts[1] += call.function.name or ""
                    parts[2] += call.function.arguments or ""
                finish = chunk.choices[0].finish_reason or finish
            return content, calls, finish

        content, calls, finish = await served.run(streamed)
    message = whole.choices[0].message
    assert content == message.content
    assert [(n, a) for _, n, a in calls.values()] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls
    ]
    assert all(i.startswith("call_") for i, _, _ in calls.values())
    assert finish == whole.choices[0].finish_reason == "tool_calls"


async def test_a_conversation_with_tool_calls_and_results_is_a_token_exact_prefix_of_the_next():
    async with _serving() as served:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful calculator."},
            {"role": "user", "content": "Add 2 and 3."},
        ]
        head = {"X-PBKV-Workflow-Id": "conv"}
        first = await served.run(
            lambda: _ask(served, tools=[ADD, SEARCH], messages=messages, extra_headers=head)
        )
        message = first.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        for call, result in zip(message["tool_calls"], ("5", "a paper"), strict=True):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        second = await served.run(
            lambda: _ask(served, tools=[ADD, SEARCH], messages=messages, extra_headers=head)
        )
        chat = served.runtime.chat
        before = [t for s in chat.segments(messages[:2], tools=[ADD, SEARCH]) for t in s.token_ids]
        after = [t for s in chat.segments(messages, tools=[ADD, SEARCH]) for t in s.token_ids]
    said = chat.encode(SAYS + chat.stop_text)
    assert after[: len(before) + len(said)] == before + list(said)  # token for token
    assert second.choices[0].message.content == "The sum is 5."
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    grown = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == grown // 16 * 16  # whole blocks


async def test_required_and_named_tool_choice_and_json_schema_get_schema_valid_replies():
    async with serving(ServerConfig(port=0), engine="sim") as served:  # no script: the sim's own
        required = await served.run(lambda: _ask(served, tools=[ADD], tool_choice="required"))
        named = {"type": "function", "function": {"name": "search"}}
        search = await served.run(lambda: _ask(served, tools=[ADD, SEARCH], tool_choice=named))
        schema = {
            "type": "object",
            "properties": {"sum": {"type": "integer"}, "tags": {"type": "array", "items": {}}},
            "required": ["sum", "tags"],
        }
        form = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        structured = await served.run(lambda: _ask(served, response_format=form))
        auto = await served.run(lambda: _ask(served, tools=[ADD], max_tokens=3))
    [call] = required.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 1, "b": 5})
    [call] = search.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "search",
        {"query": "text"},
    )
    assert required.choices[0].message.content is None
    assert json.loads(structured.choices[0].message.content) == {"sum": 1, "tags": ["text"]}
    assert structured.choices[0].finish_reason == "stop"
    assert (auto.choices[0].message.tool_calls, auto.choices[0].finish_reason) == (None, "length")


async def test_tool_choice_none_leaves_tool_call_text_as_content():
    async with _serving() as served:
        reply = await served.run(lambda: _ask(served, tools=[ADD, SEARCH], tool_choice="none"))
    assert (reply.choices[0].message.content, reply.choices[0].message.tool_calls) == (SAYS, None)
    assert reply.choices[0].finish_reason == "stop"


async def test_a_bare_user_message_gets_the_templates_default_system_prompt():
    async with serving(ServerConfig(port=0), engine="sim") as served:
        reply = await served.run(lambda: _ask(served, max_tokens=1))
        chat = served.runtime.chat
    from gguf import GGUFReader

    from pbkv.assets import smollm2_gguf_path

    field = GGUFReader(str(smollm2_gguf_path())).fields["tokenizer.chat_template"]
    template = jinja2.Template(bytes(field.parts[field.data[0]]).decode())
    text = template.render(
        messages=[{"role": "user", "content": "Add 2 and 3."}], add_generation_prompt=True
    )
    assert reply.usage.prompt_tokens == len(chat.encode(text)) == 37


async def test_ending_a_workflow_without_generating():
    async with _serving(model_aliases=("alias-a", "alias-b")) as served:
        head = {"X-PBKV-Workflow-Id": "w/1"}
        await served.run(lambda: _ask(served, model="alias-b", max_tokens=1, extra_headers=head))
        ended = await served.http("POST", "/v1/pbkv/workflows/w%2F1/end")
        again = await served.http("POST", "/v1/pbkv/workflows/w%2F1/end")
        salted = await served.http("POST", "/v1/pbkv/workflows/x/end", json={"cache_salt": "s"})
        wrong = await served.http("GET", "/v1/pbkv/workflows/x/end")
        models = await served.http("GET", "/v1/models")
        stats = await served.http("GET", "/stats")
    assert ended.status_code == 200
    assert (ended.json()["workflow_id"], ended.json()["state"]) == ("w/1", "ended")
    assert again.status_code == salted.status_code == 404
    assert again.json()["error"]["code"] == "workflow_not_found"
    assert wrong.status_code == 405
    assert [m["id"] for m in models.json()["data"]] == ["sim/qwen3-32b", "alias-a", "alias-b"]
    assert stats.json()["sessions"]["ended_by_client"] == 1
    assert [w["state"] for w in stats.json()["workflows"]] == ["ended"]
