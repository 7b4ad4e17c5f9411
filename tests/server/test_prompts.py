"""Tests for server/prompts.py: a prompt's size is checked before it is tokenized, and a
large one is tokenized off the event loop."""

from __future__ import annotations

import time

import pytest
import trio

from pbkv.server import ServerConfig
from pbkv.server.errors import APIError
from pbkv.server.prompts import MAX_CHARS_PER_TOKEN, check_size, prompt_chars
from tests.server.conftest import serving

MODEL = "sim/qwen3-32b"


def test_the_size_is_counted_in_characters_of_text_or_message_contents():
    assert prompt_chars("héllo") == 5
    assert prompt_chars([{"role": "user", "content": "ab"}, {"role": "tool"}]) == 2


def test_a_prompt_past_what_the_context_holds_is_refused_untokenized_naming_the_field():
    check_size("x" * 100 * MAX_CHARS_PER_TOKEN, "prompt", 100)
    with pytest.raises(APIError) as info:
        check_size(
            [{"role": "user", "content": "x" * (100 * MAX_CHARS_PER_TOKEN + 1)}], "messages", 100
        )
    assert (info.value.status, info.value.param) == (400, "messages")
    assert info.value.code == "context_length_exceeded"
    assert "not tokenized" in info.value.message


async def test_a_huge_prompt_is_refused_at_once_and_a_large_one_does_not_stall_the_server():
    async with serving(ServerConfig(port=0, max_body_bytes=8 * 2**20), engine="sim") as served:
        huge = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 2**20}]}
        started = time.perf_counter()
        refused = await served.http("POST", "/v1/chat/completions", json=huge)
        refused_s = time.perf_counter() - started

        large = {"model": MODEL, "prompt": "hello world, " * 76_000}  # ~1 M characters
        gaps_s: list[float] = []
        answers = []

        async def send_large() -> None:
            answers.append(await served.http("POST", "/v1/completions", json=large))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_large)
            while not answers:  # the server's own loop answers /health meanwhile
                before = time.perf_counter()
                await served.http("GET", "/health")
                gaps_s.append(time.perf_counter() - before)
    assert refused.status_code == 400 and "not tokenized" in refused.text
    assert refused_s < 1.0
    assert answers[0].json()["error"]["code"] == "context_length_exceeded"  # tokenized
    assert len(gaps_s) >= 5 and max(gaps_s) < 0.3, gaps_s
