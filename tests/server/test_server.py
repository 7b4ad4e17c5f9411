"""pbkv serve end to end: the real server on 127.0.0.1, the real openai client, tiny model."""

from __future__ import annotations

import dataclasses
import time

import httpx
import msgspec
import openai
import pytest
import trio

import pbkv
from pbkv.live.chat import smollm2_chat
from pbkv.server import ServerConfig
from tests.server.conftest import Served, chat, serving

GREEDY = {"temperature": 0.0}


async def test_second_call_of_a_workflow_extending_the_first_is_served_from_cache(
    served: Served,
):
    client = served.client()
    first_messages = chat("Plan a function that sorts a list of numbers.")

    def first():
        return client.chat.completions.create(
            model="tiny",
            messages=first_messages,
            max_tokens=8,
            extra_headers={"X-PBKV-Workflow-Id": "job-1", "X-PBKV-Agent": "planner"},
            **GREEDY,
        )

    one = await served.run(first)
    second_messages = [
        *first_messages,
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "Now write the code."},
    ]

    def second():
        return client.chat.completions.create(
            model="tiny",
            messages=second_messages,
            max_tokens=8,
            extra_body={"pbkv": {"workflow_id": "job-1", "agent": "coder", "final": True}},
            **GREEDY,
        )

    two = await served.run(second)
    assert one.usage.prompt_tokens_details.cached_tokens == 0
    cached = two.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < two.usage.prompt_tokens
    assert cached >= 16  # at least the first prompt's first whole block
    assert one.usage.completion_tokens == two.usage.completion_tokens == 8
    stats = served.runtime.statistics()
    assert stats.agents_by_workflow == {"job-1": ("planner", "coder")}
    assert stats.ended_by_reason == {"end": 1}  # ended by the call marked final
    assert stats.workflows_active == 0 and stats.leases == 0
    [record] = served.server.sessions.records()
    assert (record.workflow_id, record.agents, record.requests, record.state) == (
        "job-1",
        ["planner", "coder"],
        2,
        "final",
    )


async def test_streaming_returns_the_same_tokens_as_a_whole_reply(served: Served):
    client = served.client()
    messages = chat("Describe a binary search in one sentence.")

    def whole():
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=16, **GREEDY
        )

    def streamed():
        stream = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
        return list(stream)

    reply = await served.run(whole)
    chunks = await served.run(streamed)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert text  # the tiny model's random weights still emit text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == reply.choices[0].finish_reason == "length"
    assert all(f is None for f in finishes[:-1])
    assert [c.usage is None for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    assert usage.prompt_tokens_details.cached_tokens > 0  # same prompt, one request later
    assert len({c.id for c in chunks}) == 1


async def test_tenants_with_identical_prompts_share_no_cache(served: Served):
    client = served.client()
    messages = chat("Summarise the plan in three words.")

    def ask(salt: str):
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=4, extra_body={"cache_salt": salt}
        )

    cached = {}
    for tenant in ("t0", "t1", "t2"):
        cached[tenant] = (await served.run(ask, tenant)).usage.prompt_tokens_details
    again = (await served.run(ask, "t1")).usage.prompt_tokens_details.cached_tokens
    assert {t: d.cached_tokens for t, d in cached.items()} == {"t0": 0, "t1": 0, "t2": 0}
    assert again > 0  # the same tenant does hit: isolation, not a cold cache


async def test_api_keys_pick_tenants_and_unknown_keys_are_refused():
    config = ServerConfig(port=0, api_keys={"key-a": "acme", "key-b": "globex"})
    async with serving(config) as served:
        messages = chat("Name one sorting algorithm.")

        def ask(key: str):
            return served.client(api_key=key).chat.completions.create(
                model="tiny", messages=messages, max_tokens=4
            )

        a = await served.run(ask, "key-a")
        b = await served.run(ask, "key-b")
        a_again = await served.run(ask, "key-a")
        with pytest.raises(openai.AuthenticationError) as info:
            await served.run(ask, "key-c")
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens == 0
    assert a_again.usage.prompt_tokens_details.cached_tokens > 0
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"


async def _until(predicate, timeout_s: float = 20.0) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.05)


async def test_a_client_that_disconnects_mid_stream_cancels_its_request(served: Served):
    client = served.client()
    budget = 400

    def read_two_chunks_then_leave() -> int:
        stream = client.chat.completions.create(
            model="tiny",
            messages=chat("Write a long story about caches."),
            max_tokens=budget,
            stream=True,
            extra_headers={"X-PBKV-Workflow-Id": "story"},
            **GREEDY,
        )
        seen = 0
        for _ in stream:
            seen += 1
            if seen == 3:
                break
        stream.close()
        return seen

    def complete_calls() -> None:  # read to the end: not disconnects
        client.chat.completions.create(model="tiny", messages=chat("Hi."), max_tokens=3)
        for _ in client.chat.completions.create(
            model="tiny", messages=chat("Hi."), max_tokens=3, stream=True
        ):
            pass

    for _ in range(3):
        await served.run(complete_calls)
    await trio.sleep(0.2)
    assert served.server.app.http.disconnects == 0
    assert await served.run(read_two_chunks_then_leave) == 3
    await _until(lambda: served.server.app.http.disconnects == 1)
    # the withdrawal travels agent actor -> engine; the lease goes at the engine's next step
    await _until(lambda: served.runtime.statistics().leases == 0)
    stats = served.runtime.statistics()
    assert stats.calls_in_flight == 0
    assert stats.engine.decode_tokens < budget  # withdrawn, not decoded to its end
    assert stats.workflows_active == 1  # the hinted workflow stays open for its next call
    assert served.runtime.system.statistics()["engine"].restarts == 0  # withdrawn, not crashed
    served.runtime.kv.check_integrity()


async def test_bad_input_gets_openai_style_errors(served: Served):
    client = served.client()

    async def error(method: str, path: str, **kwargs):
        response = await served.http(method, path, **kwargs)
        return response.status_code, msgspec.json.decode(response.content)["error"]

    status, err = await error(
        "POST", "/v1/chat/completions", content=b'{"model": "tiny", "messages": ['
    )
    assert status == 400 and "not valid JSON" in err["message"]
    status, err = await error(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"},
    )
    assert (status, err["param"], err["type"]) == (400, "max_tokens", "invalid_request_error")
    status, err = await error(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2},
    )
    assert (status, err["param"]) == (400, "n")
    status, err = await error(
        "POST",
        "/v1/completions",
        headers={"X-PBKV-Final": "perhaps"},
        json={"model": "tiny", "prompt": "x"},
    )
    assert (status, err["param"]) == (400, "x-pbkv-final")
    assert (await error("GET", "/v1/chat/completions"))[0] == 405
    assert (await error("GET", "/v1/nothing"))[0] == 404

    def unknown_model():
        return client.chat.completions.create(model="gpt-9", messages=chat("x"), max_tokens=1)

    with pytest.raises(openai.NotFoundError) as info:
        await served.run(unknown_model)
    assert info.value.code == "model_not_found"

    def too_long():
        return client.completions.create(model="tiny", prompt="word " * 9000, max_tokens=4)

    with pytest.raises(openai.BadRequestError) as info:
        await served.run(too_long)
    assert info.value.code == "context_length_exceeded"
    stats = served.runtime.statistics()
    assert (stats.calls_in_flight, stats.leases, stats.workflows_active) == (0, 0, 0)


async def test_a_seed_outside_int64_is_refused_and_the_engine_keeps_serving(served: Served):
    client = served.client()

    def call(**sampling):
        return client.chat.completions.create(
            model="tiny", messages=chat("x"), max_tokens=2, temperature=1.0, **sampling
        )

    for seed in (2**70, 2**63, -(2**63) - 1, 2**70):  # more than the engine's restart budget
        with pytest.raises(openai.BadRequestError) as info:
            await served.run(lambda s=seed: call(seed=s))
        assert "$.seed" in info.value.message
    assert (await served.run(lambda: call(seed=-(2**63)))).choices[0].message.content is not None
    with pytest.raises(ValueError, match="seed must be in"):
        pbkv.Sampling(seed=2**64)

    async with serving(max_batch_size=1, max_queued_requests=0) as served:
        client = served.client()
        holding = trio.Event()
        release = trio.Event()

        def hold_a_stream():
            stream = client.chat.completions.create(
                model="tiny", messages=chat("Keep talking."), max_tokens=300, stream=True
            )
            next(iter(stream))
            trio.from_thread.run_sync(holding.set)
            trio.from_thread.run(release.wait)
            stream.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(served.run, hold_a_stream)
            await holding.wait()
            refused = await served.http(
                "POST",
                "/v1/chat/completions",
                json={"model": "tiny", "messages": chat("Me too."), "max_tokens": 2},
            )
            release.set()
        await _until(lambda: served.runtime.statistics().calls_in_flight == 0)
        accepted = await served.http(
            "POST",
            "/v1/chat/completions",
            json={"model": "tiny", "messages": chat("Me too."), "max_tokens": 2},
        )
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert msgspec.json.decode(refused.content)["error"]["type"] == "rate_limit_error"
    assert accepted.status_code == 200


async def test_hintless_requests_are_one_request_workflows_and_idle_ones_retire():
    async with serving(ServerConfig(port=0, idle_timeout_s=0.5)) as served:
        client = served.client()

        def ask(headers):
            return client.chat.completions.create(
                model="tiny", messages=chat("Hello."), max_tokens=2, extra_headers=headers
            )

        await served.run(ask, {})
        await served.run(ask, {})
        assert served.runtime.statistics().ended_by_reason == {"end": 2}
        await served.run(ask, {"X-Dynamo-Session-ID": "dyn-1", "X-PBKV-Agent": "greeter"})
        assert served.runtime.active_workflows() == ("dyn-1",)
        await _until(lambda: not served.runtime.active_workflows(), timeout_s=10)
        stats = served.stats()
    assert stats["runtime"]["ended_by_reason"] == {"end": 3}
    states = {w["workflow_id"]: w["state"] for w in stats["workflows"]}
    assert list(states.values()) == ["single", "single", "idle"]
    assert states["dyn-1"] == "idle"
    assert stats["sessions"]["ended_idle"] == 1
    assert stats["sessions"]["single_request"] == 2


async def test_completions_models_health_stats_and_metrics(served: Served):
    client = served.client()

    def complete():
        return client.completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=6, **GREEDY
        )

    reply = await served.run(complete)
    raw = await served.http(
        "POST",
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": "Once upon a time",
            "max_tokens": 6,
            "stream": True,
            "temperature": 0,
        },
    )
    models = await served.run(lambda: client.models.list())
    health = await served.http("GET", "/health")
    metrics = await served.http("GET", "/metrics")
    stats = await served.http("GET", "/stats")
    assert reply.object == "text_completion" and reply.usage.completion_tokens == 6
    events = [line for line in raw.text.split("\n\n") if line]
    assert raw.headers["content-type"] == "text/event-stream"
    assert events[-1] == "data: [DONE]"
    pieces = [msgspec.json.decode(e.removeprefix("data: ")) for e in events[:-1]]
    assert "".join(p["choices"][0]["text"] for p in pieces) == reply.choices[0].text
    assert pieces[-1]["choices"][0]["finish_reason"] == "length"
    assert [m.id for m in models.data] == ["tiny"]
    assert health.json() == {"status": "ok", "model": "tiny"}
    assert metrics.headers["content-type"].startswith("text/plain")
    lines = metrics.text.splitlines()
    assert 'pbkv_http_responses{route="/v1/completions",status="200"} 2' in lines
    assert "pbkv_runtime_kv_requests 2" in lines
    assert any(line.startswith("pbkv_runtime_kv_gpu_hit_rate ") for line in lines)
    assert stats.json()["runtime"]["kv"]["policy"] == "pbkv"


async def test_stop_sequences_cut_the_reply_where_they_first_appear(served: Served):
    client = served.client()
    messages = chat("List three words.")

    def ask(stop=None, stream=False):
        reply = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, stop=stop, stream=stream, **GREEDY
        )
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        return reply.choices[0].message.content, reply.choices[0].finish_reason

    full, _ = await served.run(ask)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut, finish = await served.run(ask, [stop])
    streamed = await served.run(ask, [stop], True)
    assert cut == streamed == full[: full.find(stop)]
    assert finish == "stop"


async def test_without_max_tokens_the_budget_is_what_the_context_leaves():
    built = pbkv.live.build_engine(pbkv.RuntimeConfig(engine="torch", check_integrity=True))
    short = dataclasses.replace(built, chat=smollm2_chat(128))  # a 128-token context
    prompt = "cache " * 100
    async with serving(built=short) as served:
        room = 128 - len(served.runtime.chat.encode(prompt))
        assert 0 < room < 256  # the default budget would not fit

        def complete():
            return served.client().completions.create(model="tiny", prompt=prompt, **GREEDY)

        reply = await served.run(complete)
    assert reply.usage.prompt_tokens == 128 - room
    if reply.choices[0].finish_reason == "length":
        assert reply.usage.completion_tokens == room
    else:  # the random model may end its turn early
        assert reply.usage.completion_tokens < room


async def test_a_stop_sequence_ends_decoding_where_it_completes(served: Served):
    client = served.client()
    messages = chat("Count from 1 to 100, one number per line.")
    budget = 40

    def ask(stop=None, stream=False):
        reply = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=budget,
            stop=stop,
            stream=stream,
            stream_options={"include_usage": True} if stream else None,
            **GREEDY,
        )
        if not stream:
            return reply.choices[0].message.content, reply.choices[0].finish_reason, reply.usage
        chunks = list(reply)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        return text, finish, chunks[-1].usage

    def decoded() -> int:
        return served.runtime.statistics().engine.decode_tokens

    full, finish, usage = await served.run(ask)
    assert (finish, usage.completion_tokens) == ("length", budget)  # the random model rambles
    stop = full[2:5]
    before = decoded()
    cut, cut_finish, cut_usage = await served.run(ask, [stop])
    whole_decoded = decoded() - before
    streamed, streamed_finish, streamed_usage = await served.run(ask, [stop], True)
    streamed_decoded = decoded() - before - whole_decoded
    assert cut == streamed == full[: full.find(stop)]
    assert cut_finish == streamed_finish == "stop"
    n = cut_usage.completion_tokens
    assert 1 <= n < 10 and streamed_usage.completion_tokens == n
    assert whole_decoded == streamed_decoded == n - 1  # the first token is the prefill's
    served.runtime.kv.check_integrity()
    assert served.runtime.statistics().leases == 0


async def _error(served: Served, path: str, body: dict) -> tuple[int, dict]:
    response = await served.http("POST", path, json=body)
    return response.status_code, msgspec.json.decode(response.content)["error"]


async def test_past_the_context_length_param_names_the_prompt_or_the_budget(served: Served):
    long, short = "word " * 9000, [{"role": "user", "content": "Say hi."}]
    status, err = await _error(served, "/v1/completions", {"model": "tiny", "prompt": long})
    assert (status, err["code"], err["param"]) == (400, "context_length_exceeded", "prompt")
    status, err = await _error(
        served,
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": long}], "max_tokens": 4},
    )
    assert (status, err["code"], err["param"]) == (400, "context_length_exceeded", "messages")
    for budget in ("max_tokens", "max_completion_tokens"):
        body = {"model": "tiny", "messages": short, budget: 10000}
        status, err = await _error(served, "/v1/chat/completions", body)
        assert (status, err["code"], err["param"]) == (400, "context_length_exceeded", budget)
    status, err = await _error(
        served, "/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 10000}
    )
    assert (status, err["param"]) == (400, "max_tokens")


async def test_a_request_that_can_never_fit_the_gpu_tier_is_a_400_not_a_500():
    async with serving(engine="sim", gpu_kv_tokens=256, host_kv_tokens=256) as served:
        model = served.server.app.model
        words = [{"role": "user", "content": "word " * 500}]
        body = {"model": model, "messages": words, "max_tokens": 4}
        status, err = await _error(served, "/v1/chat/completions", body)
        assert (status, err["code"], err["param"]) == (400, "context_length_exceeded", "messages")
        assert "tier holds 256" in err["message"] and "RequestTooLarge" not in err["message"]
        body = {"model": model, "messages": chat("Hi."), "max_tokens": 400}
        status, err = await _error(served, "/v1/chat/completions", body)
        assert (status, err["code"], err["param"]) == (400, "context_length_exceeded", "max_tokens")
        # without max_tokens the default budget is what the tier holds beside the prompt
        body = {"model": model, "messages": [{"role": "user", "content": "word " * 100}]}
        reply = await served.http("POST", "/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert 0 < reply.json()["usage"]["total_tokens"] <= 256
        stats = served.runtime.statistics()
    assert (stats.calls_in_flight, stats.leases) == (0, 0)


async def test_with_api_keys_every_v1_route_and_stats_authenticate_first():
    async with serving(ServerConfig(port=0, api_keys={"key-a": "acme"})) as served:
        bad_json = await served.http("POST", "/v1/chat/completions", content=b"{")
        wrong_model = await served.http(
            "POST", "/v1/chat/completions", json={"model": "gpt-9", "messages": chat("x")}
        )
        no_route = await served.http("GET", "/v1/nothing")
        models = await served.http("GET", "/v1/models")
        stats = await served.http("GET", "/stats")
        keyed = await served.http("GET", "/stats", headers={"Authorization": "Bearer key-a"})
        health = await served.http("GET", "/health")
        metrics = await served.http("GET", "/metrics")
    refused = [bad_json, wrong_model, no_route, models, stats]
    assert [r.status_code for r in refused] == [401] * 5
    assert all(r.json()["error"]["code"] == "invalid_api_key" for r in refused)
    assert "tiny" not in wrong_model.text  # the served model is not named to strangers
    assert (keyed.status_code, health.status_code, metrics.status_code) == (200, 200, 200)


async def test_head_health_answers_200_without_a_body(served: Served):
    response = await served.http("HEAD", "/health")
    assert (response.status_code, response.content) == (200, b"")


async def test_header_hints_are_utf8_and_one_length_limit_holds_for_headers_and_body(
    served: Served,
):
    def ask(headers=None, body=None):
        return served.http(
            "POST",
            "/v1/chat/completions",
            headers=headers or {},
            json={"model": "tiny", "messages": chat("x"), "max_tokens": 1, **(body or {})},
        )

    name = "ünïcode"
    response = await ask({"X-PBKV-Workflow-Id": name.encode(), "X-PBKV-Agent": name.encode()})
    assert response.status_code == 200
    assert dict(response.headers.raw)[b"x-pbkv-workflow-id"].decode() == name  # UTF-8
    assert served.runtime.active_workflows() == (name,)
    assert served.runtime.statistics().agents_by_workflow[name] == (name,)
    invalid = await ask({"X-PBKV-Agent": b"\xff\xfe"})
    assert (invalid.status_code, invalid.json()["error"]["param"]) == (400, "x-pbkv-agent")
    for length, status in ((256, 200), (257, 400)):
        agent = "a" * length
        by_header = await ask({"X-PBKV-Agent": agent})
        by_body = await ask(body={"pbkv": {"agent": agent}})
        assert (by_header.status_code, by_body.status_code) == (status, status)


async def test_on_the_sim_engine_a_reply_that_uses_up_max_tokens_finishes_by_length():
    async with serving(engine="sim") as served:
        client = served.client()

        def ask(**kwargs):
            reply = client.chat.completions.create(
                model=served.server.app.model, messages=chat("Hi."), max_tokens=8, **kwargs
            )
            return reply.choices[0].finish_reason, reply.usage.completion_tokens

        used_up = await served.run(ask)
        stopped = await served.run(lambda: ask(stop=["."]))
    assert used_up == ("length", 8)
    assert stopped == ("stop", 1)  # the filler's first token completes the stop


async def test_what_is_not_served_is_refused_naming_the_field_not_ignored(served: Served):
    base = {"model": "tiny", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    refused = [
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"response_format": {"type": "grammar"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": "x"}, "frequency_penalty"),
        ({"messages": [{"role": "user", "content": [image]}]}, "messages[0].content[0].type"),
        ({"functions": [tool["function"]]}, "functions"),
        ({"logit_bias": {"42": 5.0}}, "logit_bias"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ]
    for extra, param in refused:
        reply = await served.http("POST", "/v1/chat/completions", json={**base, **extra})
        assert reply.status_code == 400, (extra, reply.text)
        assert reply.json()["error"]["param"] == param, reply.text
        if param != "frequency_penalty":  # a wrong type is a plain 400
            assert reply.json()["error"]["code"] == "unsupported_parameter", reply.text
    named_g = {"type": "function", "function": {"name": "g"}}
    for extra, param in (  # malformed tool requests: a plain 400 naming the field
        ({"tools": [tool], "tool_choice": named_g}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema.schema",
        ),
    ):
        reply = await served.http("POST", "/v1/chat/completions", json={**base, **extra})
        assert reply.status_code == 400, (extra, reply.text)
        assert reply.json()["error"]["param"] == param, reply.text
    text = {"model": "tiny", "prompt": "Hi.", "max_tokens": 2}
    for extra, param in (
        ({"echo": True}, "echo"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"best_of": 2}, "best_of"),
        ({"suffix": "end"}, "suffix"),
        ({"logprobs": 0}, "logprobs"),
    ):
        reply = await served.http("POST", "/v1/completions", json={**text, **extra})
        assert reply.status_code == 400, (extra, reply.text)
        assert reply.json()["error"]["param"] == param, reply.text
    neutral = {
        "tools": [tool],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "logprobs": False,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
    }
    reply = await served.http("POST", "/v1/chat/completions", json={**base, **neutral})
    assert reply.status_code == 200, reply.text


async def test_a_hint_with_control_characters_is_refused_before_anything_runs(served: Served):
    base = {"model": "tiny", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
    for hints, param in (
        ({"workflow_id": "a\r\nSet-Cookie: x=1"}, "pbkv.workflow_id"),
        ({"workflow_id": "a\u0000b"}, "pbkv.workflow_id"),
        ({"agent": "co\nder"}, "pbkv.agent"),
    ):
        reply = await served.http("POST", "/v1/chat/completions", json={**base, "pbkv": hints})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param
    assert served.stats()["sessions"]["opened"] == 0  # refused before a workflow opened
    reply = await served.http(
        "POST", "/v1/chat/completions", json={**base, "pbkv": {"workflow_id": " lead "}}
    )
    assert reply.headers["x-pbkv-workflow-id"] == "lead"  # stored as echoed: spaces dropped
    assert [w.workflow_id for w in served.server.sessions.records()] == ["lead"]


async def test_one_auth_decision_on_the_routed_path_trailing_slashes_and_escapes_too():
    config = ServerConfig(port=0, api_keys={"key-a": "acme"})
    async with serving(config, engine="sim") as served:
        spelled = ["/stats", "/stats/", "/stats//", "/%73tats/", "/v1/models/", "/nothing"]
        keyless = [await served.http("GET", path) for path in spelled]
        keyed = await served.http("GET", "/%73tats/", headers={"Authorization": "Bearer key-a"})
        health = await served.http("GET", "/health/")
    assert [r.status_code for r in keyless] == [401] * len(spelled)
    assert "workflows" not in keyless[3].text
    assert (keyed.status_code, health.status_code) == (200, 200)


async def test_stats_lists_the_callers_tenant_and_the_admin_key_lists_every_tenant():
    keys = {"key-a": "acme", "key-b": "globex"}
    config = ServerConfig(port=0, api_keys=keys, admin_key="root")
    async with serving(config, engine="sim") as served:
        for key, workflow in (("key-a", "a-job"), ("key-b", "b-job"), ("key-a", "a-salted")):
            body = {"model": "sim/qwen3-32b", "messages": chat("hi"), "max_tokens": 2}
            body["pbkv"] = {"workflow_id": workflow}
            if workflow == "a-salted":
                body["cache_salt"] = "s1"
            auth = {"Authorization": f"Bearer {key}"}
            reply = await served.http("POST", "/v1/chat/completions", json=body, headers=auth)
            assert reply.status_code == 200, reply.text

        async def listed(key: str) -> list[tuple[str, str]]:
            stats = await served.http("GET", "/stats", headers={"Authorization": f"Bearer {key}"})
            assert stats.status_code == 200, stats.text
            return sorted((w["workflow_id"], w["tenant"]) for w in stats.json()["workflows"])

        acme, globex, admin = await listed("key-a"), await listed("key-b"), await listed("root")
        admin_elsewhere = await served.http(
            "GET", "/v1/models", headers={"Authorization": "Bearer root"}
        )
    assert acme == [("a-job", "acme"), ("a-salted", "acme/s1")]
    assert globex == [("b-job", "globex")]
    assert admin == [("a-job", "acme"), ("a-salted", "acme/s1"), ("b-job", "globex")]
    assert admin_elsewhere.status_code == 401  # the admin key reads /stats, nothing else


async def test_without_keys_stats_lists_no_salted_workflow_unless_asked_by_the_admin():
    async with serving(ServerConfig(port=0, admin_key="root"), engine="sim") as served:
        for salt in (None, "secret-salt"):
            body = {"model": "sim/qwen3-32b", "messages": chat("hi"), "max_tokens": 2}
            body |= {"pbkv": {"workflow_id": f"w-{salt}"}, "cache_salt": salt}
            assert (await served.http("POST", "/v1/chat/completions", json=body)).is_success
        anyone = await served.http("GET", "/stats")
        admin = await served.http("GET", "/stats", headers={"Authorization": "Bearer root"})
    assert [w["workflow_id"] for w in anyone.json()["workflows"]] == ["w-None"]
    assert "secret-salt" not in anyone.text
    assert len(admin.json()["workflows"]) == 2


async def test_temperature_and_top_p_too_small_for_float32_sample_instead_of_failing(
    served: Served,
):
    answers = []
    for sampling in ({"temperature": 1e-46}, {"temperature": 0.7, "top_p": 1e-46}):
        body = {"model": "tiny", "messages": chat("Name a color."), "max_tokens": 4}
        answers.append(await served.http("POST", "/v1/chat/completions", json=body | sampling))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert all(a.json()["usage"]["completion_tokens"] >= 1 for a in answers)


async def test_deeply_nested_json_is_a_400_not_a_500(served: Served):
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": '
    body += b'[{"function": ' + b"[" * 50_000 + b"]" * 50_000 + b"}]}"
    reply = await served.http("POST", "/v1/chat/completions", content=body)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "json_too_deep"


async def test_a_reply_cut_inside_a_character_is_the_same_whole_or_streamed(served: Served):
    """Seeds whose sampled reply ends inside a multi-byte character on the tiny model."""
    client = served.client()

    def both(seed: int, max_tokens: int) -> tuple[str, str]:
        ask = {
            "model": "tiny",
            "messages": chat("Write emoji \U0001f600\U0001f389 and Chinese 中文."),
        }
        ask |= {"max_tokens": max_tokens, "seed": seed, "temperature": 1.0}
        whole = client.chat.completions.create(**ask).choices[0].message.content
        pieces = client.chat.completions.create(**ask, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
        return whole, streamed

    for seed, max_tokens in ((25, 1), (23, 2), (25, 3)):
        whole, streamed = await served.run(both, seed, max_tokens)
        assert whole == streamed
        assert not whole.endswith("\ufffd")


async def test_a_fault_injected_into_one_call_fails_that_call_alone():
    async with serving(ServerConfig(port=0, fault_injection=True), engine="sim") as served:
        answers: dict[str, httpx.Response] = {}

        async def ask(name: str, fault: bool) -> None:
            body = {"model": "sim/qwen3-32b", "messages": chat(f"hi {name}"), "max_tokens": 30}
            headers = {"X-PBKV-Inject-Fault": "until"} if fault else {}
            answers[name] = await served.http(
                "POST", "/v1/chat/completions", json=body, headers=headers
            )

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(ask, f"ok-{i}", False)
            await trio.sleep(0.3)
            nursery.start_soon(ask, "faulted", True)
        bad_fault = await served.http("GET", "/health", headers={"X-PBKV-Inject-Fault": "nonsense"})
        stats = served.runtime.statistics()
    faulted = answers.pop("faulted")
    assert (faulted.status_code, faulted.json()["error"]["code"]) == (500, "injected_fault")
    assert [a.status_code for a in answers.values()] == [200] * 20
    assert (stats.calls_in_flight, stats.leases) == (0, 0)
    assert bad_fault.status_code == 200  # the header is read by completions only


async def test_without_fault_injection_the_fault_header_is_ignored():
    async with serving(ServerConfig(port=0), engine="sim") as served:
        body = {"model": "sim/qwen3-32b", "messages": chat("hi"), "max_tokens": 3}
        reply = await served.http(
            "POST", "/v1/chat/completions", json=body, headers={"X-PBKV-Inject-Fault": "until"}
        )
    assert reply.status_code == 200


async def test_a_client_stalled_mid_body_is_answered_408_when_the_body_timeout_passes():
    import socket

    async with serving(ServerConfig(port=0, body_timeout_s=1.0), engine="sim") as served:
        port = served.server.address.port

        def stall() -> tuple[bytes, float]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
                )
                started = time.perf_counter()
                answer = sock.recv(65536)
                waited_s = time.perf_counter() - started
                while not answer.endswith(b"0\r\n\r\n") and (more := sock.recv(65536)):
                    answer += more
                return answer, waited_s

        answer, waited_s = await served.run(stall)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"body_timeout" in answer
    assert 0.9 < waited_s < 3.0
