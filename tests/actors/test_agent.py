"""AgentActor (actors/agent.py): one invocation's fault fails that invocation alone."""

import pytest
import trio

import pbkv.actors.agent as agent_module
from pbkv.actors.agent import AgentActor
from pbkv.actors.events import InvocationDone, Invoke
from pbkv.engines.base import GenerateRequest, GenerateResult
from pbkv.runtime import open_actor_system


class SlowEngine:
    """Answers each request after 1 s (virtual) with the prompt's last token."""

    owns_cache, has_host_tier, has_hidden_state = True, False, False

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        await trio.sleep(1.0)
        last = request.prompt_token_ids[-1]
        return GenerateResult(
            request.request_id, (last,), len(request.prompt_token_ids), 0, 0, 0, 0, 1, 1
        )


def invoke(i: int, reply_to, **fields) -> Invoke:
    message = {
        "workflow_id": f"w{i}",
        "step": 0,
        "agent": "a",
        "segments": [(1, 2, i)],
        "output_token_ids": (),
        "reply_to": reply_to,
        "max_new_tokens": 1,
        "invocation_id": f"w{i}/0",
    }
    return Invoke(**{**message, **fields})


def faulty_request(**fields) -> GenerateRequest:
    if fields["workflow_id"] == "w3":
        raise RuntimeError("injected fault")
    return GenerateRequest(**fields)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("unhashable invocation id", "TypeError: unhashable type: 'list'"),  # in handle()
        ("malformed segments", "TypeError: 'NoneType' object is not iterable"),
        ("request builder raises", "RuntimeError: injected fault"),
    ],
)
async def test_a_fault_in_one_invocation_answers_it_and_spares_the_others(
    autojump_clock, monkeypatch, fault, expected
):
    if fault == "request builder raises":
        monkeypatch.setattr(agent_module, "GenerateRequest", faulty_request)
    bad = {
        "unhashable invocation id": {"invocation_id": ["w3", 0]},
        "malformed segments": {"segments": None},
        "request builder raises": {},
    }[fault]
    answers: dict[int, InvocationDone] = {}
    async with open_actor_system() as system:
        actor = AgentActor("a", SlowEngine())
        ref = await system.spawn(actor, name="agent/a", strategy="restart")
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(8):
                    send, receive = trio.open_memory_channel[InvocationDone](1)
                    await ref.tell(invoke(i, send, **(bad if i == 3 else {})))

                    async def wait(i=i, receive=receive) -> None:
                        answers[i] = await receive.receive()

                    nursery.start_soon(wait)
        stats = ref.statistics()
    assert sorted(answers) == list(range(8))
    failed = answers.pop(3)
    assert failed.result is None and not failed.retryable
    assert failed.error == f"agent a: {expected}"
    assert [a.result.output_token_ids for a in answers.values()] == [(i,) for i in answers]
    assert all(a.error is None for a in answers.values())
    assert (stats.failures, stats.restarts) == (0, 0)
    assert (actor.running, actor._in_flight) == (0, {})
