"""The hermes tool-call parser: whole replies, and the same replies fed piece by piece."""

import json

import pytest

from pbkv.live.chat import tool_call_text
from pbkv.server.toolparsers import ParsedCall, ParsedReply, make_tool_parser, parse_reply

ADD = tool_call_text("add", {"a": 1, "b": 2})
SEARCH = tool_call_text("search", {"query": "café"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain text", ParsedReply("plain text", ())),
        ("trailing space \n", ParsedReply("trailing space \n", ())),
        (ADD, ParsedReply(None, (ParsedCall("add", '{"a": 1, "b": 2}'),))),
        (
            f"Let me add.\n{ADD}\n{SEARCH}",
            ParsedReply(
                "Let me add.",
                (ParsedCall("add", '{"a": 1, "b": 2}'), ParsedCall("search", '{"query": "café"}')),
            ),
        ),
        (f"{ADD} and then chatter", ParsedReply(None, (ParsedCall("add", '{"a": 1, "b": 2}'),))),
        (
            "Hi <tool_call>\nnot json\n</tool_call>",
            ParsedReply("Hi <tool_call>\nnot json\n</tool_call>", ()),
        ),
        (
            '<tool_call>\n{"name": "add", "arguments": {}}',
            ParsedReply(None, (ParsedCall("add", "{}"),)),
        ),
        (
            '<tool_call>\n{"name": "add", "argu',
            ParsedReply('<tool_call>\n{"name": "add", "argu', ()),
        ),
        ("a < b <tool", ParsedReply("a < b <tool", ())),
    ],
)
def test_a_reply_parses_the_same_whole_and_fed_a_character_at_a_time(text, expected):
    assert parse_reply(make_tool_parser("hermes"), text) == expected
    parser = make_tool_parser("hermes")
    pieces = [p for ch in text for p in parser.feed(ch)] + parser.finish()
    content = "".join(p for p in pieces if isinstance(p, str))
    calls = tuple(p for p in pieces if isinstance(p, ParsedCall))
    assert (content or (None if calls else ""), calls) == expected


def test_arguments_written_as_json_text_or_as_parameters_are_read():
    text = '<tool_call>{"name": "f", "parameters": {"x": [1]}}</tool_call>'
    assert parse_reply(make_tool_parser("qwen25"), text).calls == (ParsedCall("f", '{"x": [1]}'),)
    text = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    assert json.loads(parse_reply(make_tool_parser("hermes"), text).calls[0].arguments) == {"x": 1}


def test_an_unknown_parser_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match="known: hermes, qwen25"):
        make_tool_parser("mistral")
