"""Constrained decoding, engine-independent: schema-valid examples (the sim's replies),
and token masks that hold any logits to a tool call or a JSON schema (llguidance)."""

from __future__ import annotations

import json
import types

import jsonschema
import pytest
import torch

from pbkv.assets import decode, encode
from pbkv.engines.constrained import (
    OutputFormat,
    TokenConstraint,
    json_format,
    request_constraint,
    schema_example,
    smollm2_tokenizer,
    tool_call_format,
)
from pbkv.server.toolparsers import ParsedCall, make_tool_parser, parse_reply

pytest.importorskip("llguidance")

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
PICK = {
    "type": "function",
    "function": {
        "name": "pick",
        "parameters": {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green"]}, "sure": {"type": "boolean"}},
            "required": ["colour", "sure"],
        },
    },
}
END = encode("<|im_end|>")[0]


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object", "properties": {"x": {"type": "string"}}}, {"x": "text"}),
        ({"type": "object", "properties": {"x": {}, "y": {}}, "required": ["y"]}, {"y": "text"}),
        ({"type": "integer", "minimum": 7}, 7),
        ({"type": "number", "exclusiveMaximum": 0}, -1),
        ({"type": ["null", "boolean"]}, True),
        ({"anyOf": [{"const": "a"}, {"type": "integer"}]}, "a"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 1]),
        ({"type": "string", "format": "date", "maxLength": 4}, "2026"),
        (
            {
                "$defs": {"P": {"type": "object", "properties": {"n": {"type": "integer"}}}},
                "allOf": [{"$ref": "#/$defs/P"}, {"properties": {"m": {"enum": [3]}}}],
            },
            {"n": 1, "m": 3},
        ),
    ],
)
def test_the_example_of_a_schema_is_small_and_valid(schema, expected):
    value = schema_example(schema)
    assert value == expected
    jsonschema.validate(value, schema)


def test_a_tool_call_example_is_the_text_history_renders():
    text = tool_call_format([ADD]).example()
    assert text == '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    assert parse_reply(make_tool_parser("hermes"), text).calls == (
        ParsedCall("add", '{"a": 1, "b": 1}'),
    )


def _decode_under(constraint: TokenConstraint, seed: int, budget: int = 120) -> list[int]:
    """Greedy decoding of random logits under ``constraint``: any model's worst case."""
    generator = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while len(out) < budget and (not out or out[-1] != END):
        logits = torch.randn(49_152, generator=generator)
        out.append(int(constraint.mask_logits(out, logits).argmax()))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_logits_under_a_tool_choice_mask_make_a_valid_call(seed):
    constraint = TokenConstraint(tool_call_format([ADD, PICK]), smollm2_tokenizer())
    out = _decode_under(constraint, seed)
    assert out[-1] == END  # the format closes, then only the end of turn is allowed
    [call] = parse_reply(make_tool_parser("hermes"), decode(out[:-1])).calls
    tool = {"add": ADD, "pick": PICK}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])
    assert set(json.loads(call.arguments)) == set(tool["function"]["parameters"]["properties"])


def test_a_json_schema_mask_holds_the_separators_and_the_schema():
    schema = PICK["function"]["parameters"]
    constraint = TokenConstraint(json_format(schema), smollm2_tokenizer())
    text = decode(_decode_under(constraint, 3)[:-1])
    jsonschema.validate(json.loads(text), schema)
    assert text == json.dumps(json.loads(text))  # json.dumps's form, token for token
    compact = TokenConstraint(json_format(schema), smollm2_tokenizer())
    with pytest.raises(ValueError, match="breaks the output format"):
        compact.allowed(encode('{"colour":"red"'))


def test_the_mask_covers_a_model_vocabulary_larger_than_the_tokenizers():
    constraint = TokenConstraint(OutputFormat(prefix="<tool_call>"), smollm2_tokenizer())
    masked = constraint.mask_logits([], torch.zeros(49_152 + 64))
    assert masked.shape == (49_216,) and torch.isinf(masked[49_152:]).all()
    assert masked[encode("<")[0]] == 0


def test_an_engine_finds_the_constraint_on_the_request_callback():
    constraint = TokenConstraint(json_format(), smollm2_tokenizer())
    until = types.SimpleNamespace(constraint=constraint)
    live_call = types.SimpleNamespace(until=until, on_token=None)
    live_call.on_token = types.MethodType(lambda self, token: False, live_call)
    assert request_constraint(types.SimpleNamespace(on_token=live_call.on_token)) is constraint
    assert request_constraint(types.SimpleNamespace(on_token=None)) is None


NESTED = {  # a pydantic model holding a list of another (CrewAI's output_pydantic)
    "type": "function",
    "function": {
        "name": "plan_day",
        "parameters": {
            "$defs": {
                "Activity": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "hours": {"type": "integer"}},
                    "required": ["name", "hours"],
                }
            },
            "type": "object",
            "properties": {"activities": {"type": "array", "items": {"$ref": "#/$defs/Activity"}}},
            "required": ["activities"],
        },
    },
}


@pytest.mark.parametrize("tools", [[NESTED], [ADD, NESTED]])
def test_a_tool_whose_parameters_use_defs_gives_a_format_that_resolves(tools):
    formatted = tool_call_format(tools)
    [call] = parse_reply(make_tool_parser("hermes"), formatted.example()).calls
    tool = {"add": ADD, "plan_day": NESTED}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])
    jsonschema.validate(
        json.loads(formatted.example()[len("<tool_call>\n") : -len("\n</tool_call>")]),
        formatted.schema,
    )
    TokenConstraint(formatted, smollm2_tokenizer())  # llguidance compiles it
    out = _decode_under(TokenConstraint(tool_call_format([NESTED]), smollm2_tokenizer()), 0, 300)
    assert out[-1] == END
    [call] = parse_reply(make_tool_parser("hermes"), decode(out[:-1])).calls
    jsonschema.validate(json.loads(call.arguments), NESTED["function"]["parameters"])


INTO_BODY = {  # a $ref into the schema's own body, beside one into its $defs
    "type": "function",
    "function": {
        "name": "move",
        "parameters": {
            "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "type": "object",
            "properties": {"src": {"$ref": "#/$defs/P"}, "dst": {"$ref": "#/properties/src"}},
            "required": ["src", "dst"],
        },
    },
}


@pytest.mark.parametrize("tools", [[INTO_BODY], [ADD, INTO_BODY]])
def test_a_ref_into_the_parameters_body_still_resolves_once_hoisted(tools):
    formatted = tool_call_format(tools)
    body = json.loads(formatted.example()[len("<tool_call>\n") : -len("\n</tool_call>")])
    jsonschema.validate(body, formatted.schema)
    if body["name"] == "move":
        jsonschema.validate(body["arguments"], INTO_BODY["function"]["parameters"])
    TokenConstraint(formatted, smollm2_tokenizer())  # llguidance compiles it
