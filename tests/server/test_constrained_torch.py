"""Constrained decoding on the torch engine (tiny random model): a required tool call and a
JSON schema come out valid whatever the random weights prefer (issue 29, item 2)."""

from __future__ import annotations

import json

from pbkv.server import ServerConfig
from tests.server.conftest import serving
from tests.server.test_toolcalls import ADD, _ask


async def test_required_tool_choice_and_a_json_schema_are_valid_on_the_tiny_model():
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    form = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    async with serving(ServerConfig(port=0), engine="torch") as served:
        called = await served.run(
            lambda: _ask(served, tools=[ADD], tool_choice="required", max_tokens=64)
        )
        shaped = await served.run(lambda: _ask(served, response_format=form, max_tokens=64))
    [call] = called.choices[0].message.tool_calls
    assert called.choices[0].finish_reason == "tool_calls"
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "add" and set(arguments) == {"a", "b"}
    assert isinstance(arguments["a"], int) and arguments["b"] >= 5
    answer = json.loads(shaped.choices[0].message.content)
    assert set(answer) == {"ok", "n"} and isinstance(answer["ok"], bool)
