"""Requests decode once into typed records; bad input is a 400 naming the field."""

import msgspec
import pytest

from pbkv.server.errors import APIError, decode_body
from pbkv.server.schemas import CHAT_DECODER, COMPLETION_DECODER, ErrorBody


def _chat(**fields) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.json.encode(body)


def test_chat_request_decodes_hints_stream_options_and_text_parts():
    body = _chat(
        stream=True,
        stream_options={"include_usage": True},
        pbkv={"workflow_id": "w", "agent": "a", "final": True},
        cache_salt="t1",
        logprobs=False,  # unknown to pbkv: tolerated
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    )
    request = decode_body(CHAT_DECODER, body)
    assert request.stream and request.stream_options.include_usage
    assert (request.pbkv.workflow_id, request.pbkv.agent, request.pbkv.final) == ("w", "a", True)
    assert request.cache_salt == "t1"
    assert request.messages[0].text() == "ab"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3.0}, "temperature"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"pbkv": {"final": "yes"}}, "pbkv.final"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_400_naming_it(fields, param):
    with pytest.raises(APIError) as info:
        decode_body(CHAT_DECODER, _chat(**fields))
    assert info.value.status == 400
    assert info.value.param == param
    body = msgspec.json.decode(info.value.body(), type=ErrorBody)
    assert body.error.type == "invalid_request_error"
    assert param in body.error.message


def test_missing_field_and_malformed_json():
    with pytest.raises(APIError) as info:
        decode_body(COMPLETION_DECODER, b'{"model": "tiny"}')
    assert info.value.status == 400
    assert "prompt" in info.value.message
    with pytest.raises(APIError) as info:
        decode_body(CHAT_DECODER, b'{"model": "tiny", "messages": [')
    assert info.value.status == 400
    assert "not valid JSON" in info.value.message


@pytest.mark.parametrize(
    ("decoder", "body", "param"),
    [
        (COMPLETION_DECODER, b'{"model": "tiny"}', "prompt"),
        (COMPLETION_DECODER, b'{"prompt": "x"}', "model"),
        (CHAT_DECODER, b'{"model": "tiny"}', "messages"),
        (CHAT_DECODER, b'{"model": "tiny", "messages": [{"content": "x"}]}', "messages[0].role"),
    ],
)
def test_a_missing_required_field_is_a_400_naming_it(decoder, body, param):
    with pytest.raises(APIError) as info:
        decode_body(decoder, body)
    assert (info.value.status, info.value.param) == (400, param)


@pytest.mark.parametrize(
    ("field", "opens", "closes"),
    [("tools", b'[{"a": ', b"}]"), ("response_format", b'{"a": ', b"}"), ("vendor", b"", b"")],
)
def test_json_nested_too_deeply_is_a_400_saying_so(field, opens, closes):
    nested = opens + b"[" * 100_000 + b"]" * 100_000 + closes
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "'
    body += field.encode() + b'": ' + nested + b"}"
    with pytest.raises(APIError) as info:
        decode_body(CHAT_DECODER, body)
    assert (info.value.status, info.value.code) == (400, "json_too_deep")
    assert "nests JSON arrays and objects too deeply" in info.value.message
