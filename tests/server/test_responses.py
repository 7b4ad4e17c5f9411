"""The Responses API over HTTP (sim engine, replies scripted): text, function tools,
streaming, and a conversation whose items render as a prefix of the next call."""

from __future__ import annotations

import json
from typing import Any

from pbkv.live.chat import tool_call_text
from pbkv.server import ServerConfig
from pbkv.server.toolcalls import ReplyContext
from tests.server.conftest import Served, serving

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def script(ctx: ReplyContext) -> str | None:
    if ctx.messages[-1]["role"] == "tool":
        return f"It is {ctx.messages[-1]['content']}."
    return "Adding.\n" + tool_call_text("add", {"a": 2, "b": 3}) if ctx.plan.tools else None


def _create(served: Served, **body: Any) -> Any:
    body.setdefault("model", served.runtime.model_name)
    return served.client().responses.create(**body)


async def test_a_function_call_and_its_output_round_trip_and_the_next_call_is_cached():
    async with serving(ServerConfig(port=0, reply_source=script), engine="sim") as served:
        head = {"X-PBKV-Workflow-Id": "r1", "X-PBKV-Agent": "calc"}
        items: list[Any] = [{"role": "user", "content": "Add 2 and 3."}]
        first = await served.run(
            lambda: _create(
                served, instructions="Be exact.", input=items, tools=[ADD], extra_headers=head
            )
        )
        message, call = first.output
        items += [o.model_dump(exclude_none=True) for o in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
        second = await served.run(
            lambda: _create(
                served, instructions="Be exact.", input=items, tools=[ADD], extra_headers=head
            )
        )
        plain = await served.run(lambda: _create(served, input="Hello", max_output_tokens=4))
    assert (message.type, message.content[0].text) == ("message", "Adding.")
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "add",
        {"a": 2, "b": 3},
    )
    assert first.status == "completed" and first.usage.input_tokens_details.cached_tokens == 0
    assert second.output_text == "It is 5."
    grown = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens == grown // 16 * 16
    assert (plain.status, plain.incomplete_details.reason, plain.usage.output_tokens) == (
        "incomplete",
        "max_output_tokens",
        4,
    )


async def test_streamed_events_reassemble_to_the_whole_response():
    async with serving(ServerConfig(port=0, reply_source=script), engine="sim") as served:
        whole = await served.run(lambda: _create(served, input="Add.", tools=[ADD]))

        def streamed() -> tuple[list[str], str, list[Any], Any]:
            kinds, text, done, final = [], "", [], None
            for event in _create(served, input="Add.", tools=[ADD], stream=True):
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    text += event.delta
                elif event.type == "response.output_item.done":
                    done.append(event.item)
                elif event.type == "response.completed":
                    final = event.response
            return kinds, text, done, final

        kinds, text, done, final = await served.run(streamed)
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * (len(kinds) - 12),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert text == whole.output[0].content[0].text == "Adding."
    assert [(i.type, getattr(i, "name", None)) for i in done] == [
        ("message", None),
        ("function_call", "add"),
    ]
    assert done[1].arguments == whole.output[1].arguments
    assert [o.type for o in final.output] == ["message", "function_call"]


async def test_what_the_responses_api_does_not_serve_is_refused_naming_the_field():
    async with serving(ServerConfig(port=0), engine="sim") as served:
        model = served.runtime.model_name
        refused = []
        for extra in (
            {"previous_response_id": "resp_1"},
            {"tools": [{"type": "web_search"}]},
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        ):
            body = {"model": model, "input": "Hi", **extra}
            reply = await served.http("POST", "/v1/responses", json=body)
            refused.append((reply.status_code, reply.json()["error"]["param"]))
    assert refused == [
        (400, "previous_response_id"),
        (400, "tools[0].type"),
        (400, "input[0].content[0].type"),
    ]


def test_a_websocket_upgrade_is_refused_with_a_404_that_says_so():
    import base64
    import socket
    from urllib.parse import urlparse

    from tests.server.conftest import serve_process

    with serve_process() as served:
        url = urlparse(served.url)
        with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
            key = base64.b64encode(b"0123456789abcdef").decode()
            conn.sendall(
                (
                    "GET /v1/responses HTTP/1.1\r\n"
                    f"Host: {url.hostname}:{url.port}\r\n"
                    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
            )
            reply = b""
            while b"WebSocket; use HTTP" not in reply:  # the body (chunked or not)
                chunk = conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split()[1] == b"404", head
    assert b'"message":"/v1/responses is not served over WebSocket; use HTTP"' in body
