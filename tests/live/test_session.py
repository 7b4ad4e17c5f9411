"""Live workflow sessions (live/session.py) on the sim and the tiny torch engine."""

import contextlib
import threading
import time

import numpy as np
import pytest
import trio
import trio.testing

import pbkv
from pbkv.actors.events import (
    AgentFinished,
    AgentInvoked,
    LifecycleEvent,
    WorkflowStarted,
    WorkflowTerminated,
)
from pbkv.actors.workload import Segment
from pbkv.engines.base import GenerateRequest
from pbkv.runtime import EventRecorder, read_events

SYSTEM = {"role": "system", "content": "You are one agent of a team. " * 12}


def chat(*user: str) -> list[dict[str, str]]:
    return [SYSTEM, *({"role": "user", "content": u} for u in user)]


def sim(**fields):
    return pbkv.RuntimeConfig(engine="sim", check_integrity=True, **fields)


async def test_second_call_extending_the_first_is_served_from_cache(autojump_clock, tmp_path):
    log = tmp_path / "events.jsonl"
    with EventRecorder(log) as recorder:
        async with pbkv.open_runtime(sim(), recorder=recorder) as rt:
            async with rt.workflow(app="demo", task_text="plan a trip") as wf:
                first = await wf.call("planner", chat("Plan a trip."), max_new_tokens=8)
                history = [
                    *chat("Plan a trip."),
                    {"role": "assistant", "content": first.text},
                    {"role": "user", "content": "Shorter."},
                ]
                second = await wf.call("planner", history, max_new_tokens=8)
            stats = rt.statistics()
    assert first.cached_tokens == 0
    # every full block of the first prompt is reused by the second
    assert second.cached_tokens == first.prompt_tokens // 16 * 16
    assert second.computed_tokens == second.prompt_tokens - second.cached_tokens
    assert stats.leases == 0 and stats.ended_by_reason == {"end": 1}
    kinds = [type(e) for e in read_events(log, LifecycleEvent)]
    assert kinds[0] is WorkflowStarted and kinds[-1] is WorkflowTerminated
    assert kinds.count(AgentInvoked) == 2 and kinds.count(AgentFinished) == 2


async def test_tenants_never_share_cache(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt:
        cached = []
        for tenant in ("a", "b", "c"):
            async with rt.workflow(tenant=tenant) as wf:
                cached.append((await wf.call("agent", chat("Same prompt."))).cached_tokens)
        async with rt.workflow(tenant="a") as wf:
            again = await wf.call("agent", chat("Same prompt."))
    assert cached == [0, 0, 0]
    assert again.cached_tokens > 0


async def test_sim_reply_is_the_simulated_text_padded_to_its_length(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt, rt.workflow() as wf:
        reply = await wf.call(
            "tester", chat("Run the tests."), simulated=pbkv.Simulated("FAIL: 2 tests", 40)
        )
    assert reply.text.startswith("FAIL: 2 tests")
    assert len(reply.token_ids) == 40 and reply.finish_reason == "stop"


async def test_leaving_the_block_by_an_error_ends_the_workflow_aborted(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt:
        with pytest.raises(KeyError):
            async with rt.workflow("w1") as wf:
                await wf.call("agent", chat("hi"), max_new_tokens=4)
                raise KeyError("app bug")
        assert wf.reason == "aborted"
        with pytest.raises(pbkv.WorkflowEnded):
            await wf.call("agent", chat("again"))
        assert rt.statistics().ended_by_reason == {"aborted": 1}


async def test_cancelling_a_call_mid_prefill_leaves_no_lease(autojump_clock):
    long_prompt = chat("word " * 3000)
    async with pbkv.open_runtime(sim(max_batch_size=4)) as rt:
        async with rt.workflow("w1") as wf:
            with trio.move_on_after(0.01):  # far less than the prefill of ~3k tokens
                await wf.call("agent", long_prompt, max_new_tokens=64)
            assert rt.statistics().calls_in_flight == 0
            await trio.sleep(5)  # let the engine notice and settle
            assert rt.statistics().leases == 0
        rt.kv.check_integrity()
        assert rt.statistics().leases == 0


async def test_concurrent_calls_fan_out_and_overload_is_refused(autojump_clock):
    config = sim(max_batch_size=2, max_queued_requests=1)
    async with pbkv.open_runtime(config) as rt, rt.workflow() as wf:
        replies = []

        async def one(i: int) -> None:
            replies.append(await wf.call(f"agent{i}", chat(f"task {i}"), max_new_tokens=4))

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(pbkv.Overloaded):
                await wf.call("agent9", chat("one too many"))
    assert sorted(r.agent for r in replies) == ["agent0", "agent1", "agent2"]
    assert len({r.step for r in replies}) == 3


async def test_bad_input_is_refused_with_the_field_named(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt, rt.workflow() as wf:
        with pytest.raises(ValueError, match=r"messages\[1\].role"):
            await wf.call("a", [SYSTEM, {"role": "wizard", "content": "x"}])
        with pytest.raises(ValueError, match="max_new_tokens"):
            await wf.call("a", chat("x"), max_new_tokens=0)
        with pytest.raises(pbkv.PromptTooLong, match="context length"):
            await wf.call("a", chat("x"), max_new_tokens=10**6)
        # refused before the sim engine builds the reply (10**12 tokens would not fit)
        with pytest.raises(pbkv.PromptTooLong, match="context length"):
            await wf.call("a", chat("x"), max_new_tokens=10**12)
        with pytest.raises(ValueError, match="already open"):
            await rt.open_workflow(wf.workflow_id)


@pytest.fixture(scope="module")
def tiny_engine():
    pytest.importorskip("torch")
    return pbkv.live.build_engine(pbkv.RuntimeConfig(engine="torch", check_integrity=True))


async def test_torch_streaming_matches_the_whole_reply_and_reuses_cache():
    config = pbkv.RuntimeConfig(engine="torch", check_integrity=True, host_kv_tokens=0)
    async with pbkv.open_runtime(config) as rt, rt.workflow() as wf:
        whole = await wf.call("writer", chat("Write a haiku."), max_new_tokens=12)
        async with wf.stream("writer", chat("Write a haiku."), max_new_tokens=12) as stream:
            deltas = [d async for d in stream]
    assert stream.reply is not None
    assert sum((d.token_ids for d in deltas), ()) == whole.token_ids == stream.reply.token_ids
    assert "".join(d.text for d in deltas) == whole.text
    assert stream.reply.cached_tokens > 0
    assert rt.statistics().leases == 0


async def test_torch_sampling_is_reproducible_with_a_seed():
    config = pbkv.RuntimeConfig(engine="torch", host_kv_tokens=0)
    sampling = pbkv.Sampling(temperature=1.0, top_p=0.9, seed=7)
    async with pbkv.open_runtime(config) as rt, rt.workflow() as wf:
        a = await wf.call("w", chat("Say something."), max_new_tokens=10, sampling=sampling)
        b = await wf.call("w", chat("Say something."), max_new_tokens=10, sampling=sampling)
        greedy = await wf.call("w", chat("Say something."), max_new_tokens=10)
    assert a.token_ids == b.token_ids
    assert a.token_ids != greedy.token_ids


async def test_torch_leaving_a_stream_early_withdraws_it_without_failing_the_engine():
    config = pbkv.RuntimeConfig(engine="torch", check_integrity=True, host_kv_tokens=0)
    async with pbkv.open_runtime(config) as rt, rt.workflow() as wf:
        async with wf.stream("writer", chat("Write a long story."), max_new_tokens=200) as s:
            async for _ in s:
                break  # the engine keeps stepping until the withdrawal reaches it
        with trio.fail_after(20):
            while rt.statistics().leases:
                await trio.sleep(0.01)
        assert rt.system.statistics()["engine"].restarts == 0
        assert rt.statistics().engine.decode_tokens < 200


async def test_a_workflow_the_stopped_runtime_cannot_start_is_not_left_open(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt:
        pass
    with pytest.raises(pbkv.runtime.ActorStopped):
        await rt.open_workflow("late")
    assert rt.active_workflows() == ()
    assert (rt.statistics().workflows_active, rt.statistics().workflows_started) == (0, 0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"host_kv_tokens": -1}, r"host_kv_tokens must be >= 0 \(0: no host tier\), got -1"),
        ({"gpu_kv_tokens": 3}, r"gpu_kv_tokens must hold at least one block \(16 tokens\)"),
    ],
)
def test_kv_tier_sizes_are_refused_with_the_rule_they_break(fields, message):
    with pytest.raises(ValueError, match=message):
        pbkv.RuntimeConfig(engine="sim", **fields)


async def test_agent_actors_stay_bounded_however_many_names_clients_use(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt:
        rt.max_idle_agents = 3

        async def one(agent: str) -> pbkv.Reply:
            async with rt.workflow() as wf:
                return await wf.call(agent, chat("hi"), max_new_tokens=2)

        for i in range(10):
            await one(f"agent-{i}")
        agents = [n for n in rt.system.names() if n.startswith("agent/")]
        assert agents == ["agent/agent-7", "agent/agent-8", "agent/agent-9"]
        async with trio.open_nursery() as nursery:  # busy ones are never stopped
            for i in range(6):
                nursery.start_soon(one, f"busy-{i}")
        assert len([n for n in rt.system.names() if n.startswith("agent/")]) <= 6
        again = await one("agent-0")  # stopped as idle, spawned again
        assert len(again.token_ids) == 2
        assert len([n for n in rt.system.names() if n.startswith("agent/")]) <= 3
        assert rt.statistics().calls_in_flight == 0 and rt.statistics().leases == 0


def _within(timeout_s: float, scenario, *, clock=None):
    """Run ``scenario`` in its own trio run on a daemon thread; fail if it does not end
    within ``timeout_s`` real seconds (a hung shutdown would hang pytest-trio for ever)."""
    outcome: list = []

    def main() -> None:
        try:
            outcome.append(trio.run(scenario, clock=clock))
        except BaseException as error:  # noqa: BLE001 (handed to the test below)
            outcome.append(error)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert outcome, f"did not finish within {timeout_s} s"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


async def _shut_down_with_open_workflows(n: int, how: str) -> tuple[pbkv.Runtime, float]:
    """Open ``n`` workflows and never end them; leave ``open_runtime`` by ``how``; return
    the runtime and how long leaving took (trio's clock)."""
    with trio.CancelScope() as outer, contextlib.suppress(KeyError):
        async with pbkv.open_runtime(sim()) as rt:
            for _ in range(n):
                await rt.open_workflow()
            left_s = trio.current_time()
            if how == "cancelled":  # SIGTERM in pbkv serve: the whole runtime is cancelled
                outer.cancel()
                await trio.sleep(1)
            elif how == "raised":
                raise KeyError("app bug")
    return rt, trio.current_time() - left_s


@pytest.mark.parametrize("how", ["exited", "raised", "cancelled"])
def test_shutdown_with_2000_open_workflows_ends_them_promptly_in_virtual_time(how):
    """More open workflows than the KV manager's mailbox holds (1,024) never hang the
    shutdown, however the block is left: each is ended ``aborted``."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    rt, took_s = _within(20, lambda: _shut_down_with_open_workflows(2000, how), clock=clock)
    assert took_s < 1.0
    assert rt.active_workflows() == ()
    assert rt.statistics().ended_by_reason == {"aborted": 2000}


def test_shutdown_with_2000_open_workflows_cancelled_ends_within_seconds_in_real_time():
    started_s = time.perf_counter()
    rt, _ = _within(20, lambda: _shut_down_with_open_workflows(2000, "cancelled"))
    assert time.perf_counter() - started_s < 10.0
    assert rt.statistics().ended_by_reason == {"aborted": 2000}


async def test_an_until_that_raises_fails_its_own_call_alone(autojump_clock):
    """Four faulty ``until`` callbacks among 20 calls in flight: each fails its own call
    with its own error; the engine never stops (its restart budget is three in 60 s)."""

    def faulty(token: int) -> bool:
        raise ZeroDivisionError(f"stop check failed at token {token}")

    replies: list[pbkv.Reply] = []
    faults: list[BaseException] = []
    async with pbkv.open_runtime(sim(max_batch_size=32)) as rt:

        async def one(i: int, until) -> None:
            try:
                async with rt.workflow() as wf:
                    replies.append(await wf.call(f"a{i % 3}", chat(f"task {i}"), until=until))
            except ZeroDivisionError as error:
                faults.append(error)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(24):
                    until = faulty if i % 6 == 5 else (lambda t: False) if i % 2 else None
                    nursery.start_soon(one, i, until)
        stats = rt.statistics()
        assert rt.system.statistics()["engine"].restarts == 0
        async with rt.workflow() as wf:  # the runtime still serves
            assert len((await wf.call("a0", chat("after"), max_new_tokens=4)).token_ids) == 4
    assert len(faults) == 4 and all("stop check failed" in str(e) for e in faults)
    assert sorted(len(r.token_ids) for r in replies) == [256] * 20
    assert (stats.calls_in_flight, stats.leases) == (0, 0)
    assert stats.ended_by_reason == {"end": 20, "aborted": 4}


async def test_a_fault_in_the_agent_actor_fails_that_call_alone(autojump_clock, monkeypatch):
    """A fault while the agent actor handles one call (here: building its engine request)
    answers that call with the error; the agent's seven other calls in flight complete."""
    import pbkv.actors.agent as agent_module

    def faulty_request(**fields):
        if fields["workflow_id"] == "w3":
            raise RuntimeError("injected fault")
        return GenerateRequest(**fields)

    monkeypatch.setattr(agent_module, "GenerateRequest", faulty_request)
    replies: dict[str, pbkv.Reply] = {}
    failures: dict[str, pbkv.CallFailed] = {}
    async with pbkv.open_runtime(sim()) as rt:

        async def one(workflow_id: str) -> None:
            async with rt.workflow(workflow_id) as wf:
                try:
                    replies[workflow_id] = await wf.call("coder", chat(workflow_id))
                except pbkv.CallFailed as error:
                    failures[workflow_id] = error

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(one, f"w{i}")
        agent = rt.system.statistics()["agent/coder"]
        stats = rt.statistics()
    assert sorted(replies) == [f"w{i}" for i in range(8) if i != 3]
    assert all(len(r.token_ids) == 256 for r in replies.values())
    assert list(failures) == ["w3"] and not failures["w3"].retryable
    assert str(failures["w3"]) == "coder (step 0): agent coder: RuntimeError: injected fault"
    assert (agent.failures, agent.restarts) == (0, 0)
    assert (stats.calls_in_flight, stats.leases) == (0, 0)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {"sampling": {"temperature": 0.5}},
            TypeError,
            r"sampling must be a pbkv.Sampling \(e.g. .*\), got dict",
        ),
        ({"prompt": [Segment("context", "abc")]}, TypeError, r"prompt\[0\].token_ids must be"),
        ({"prompt": [Segment("context", ("1", 2))]}, TypeError, r"prompt\[0\].token_ids\[0\]"),
        (
            {"prompt": [Segment("role", (1,)), Segment("context", (2, True))]},
            TypeError,
            r"prompt\[1\].token_ids\[1\]",
        ),
        (
            {"prompt": [Segment("context", (5, -1))]},
            ValueError,
            r"prompt\[0\].token_ids\[1\] must be >= 0, got -1",
        ),
        ({"prompt": [Segment("ctx", (1, 2))]}, ValueError, r"prompt\[0\].kind must be one of"),
        ({"simulated": "text"}, TypeError, "simulated must be a pbkv.Simulated or None, got str"),
        ({"simulated": pbkv.Simulated(token_ids="abc")}, TypeError, "simulated.token_ids must be"),
        (
            {"simulated": pbkv.Simulated(output_tokens="5")},
            TypeError,
            "simulated.output_tokens must be an int",
        ),
        (
            {"simulated": pbkv.Simulated(gap_s=-1.0)},
            ValueError,
            "simulated.gap_s must be finite and >= 0",
        ),
        ({"simulated": pbkv.Simulated(text=3)}, TypeError, "simulated.text must be a str"),
        ({"step": "3"}, TypeError, "step must be an int or None, got '3'"),
        ({"step": -1}, ValueError, "step must be >= 0, got -1"),
        ({"until": 3}, TypeError, "until must be callable or None, got int"),
        ({"context_tail": 3}, TypeError, "context_tail must be a str, got int"),
    ],
)
async def test_bad_call_arguments_are_refused_naming_the_argument(
    autojump_clock, arguments, error, message
):
    """Misuse is refused before anything reaches the engine (which failed deep inside)."""
    async with pbkv.open_runtime(sim()) as rt, rt.workflow() as wf:
        arguments = {"prompt": chat("x"), **arguments}
        with pytest.raises(error, match=message):
            await wf.call("a", arguments.pop("prompt"), max_new_tokens=4, **arguments)
        stats = rt.statistics()
    assert (stats.kv.requests, stats.calls_in_flight) == (0, 0)


async def test_token_ids_as_a_list_or_numpy_ints_are_accepted(autojump_clock):
    ids = np.arange(1, 40)
    async with pbkv.open_runtime(sim()) as rt, rt.workflow() as wf:
        listed = await wf.call("a", [Segment("context", list(range(1, 40)))], max_new_tokens=4)
        arrayed = await wf.call(
            "a",
            [Segment("context", tuple(ids))],
            max_new_tokens=4,
            simulated=pbkv.Simulated(token_ids=tuple(np.arange(5, 9))),
        )
    assert listed.prompt_tokens == arrayed.prompt_tokens == 39
    assert arrayed.token_ids == (5, 6, 7, 8) and arrayed.cached_tokens == 32
    assert all(type(t) is int for t in arrayed.token_ids)


async def test_concurrent_calls_given_the_same_step_are_cancelled_apart(autojump_clock):
    """Two calls retrying one step at once: cancelling one leaves the other running."""
    async with pbkv.open_runtime(sim()) as rt, rt.workflow() as wf:
        replies = []

        async def first() -> None:
            with trio.move_on_after(0.01):  # far less than 256 decode steps
                await wf.call("a", chat("first"), step=0)

        async def second() -> None:
            replies.append(await wf.call("a", chat("second"), step=0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.sleep(0.001)  # the second reaches the agent after the first
            nursery.start_soon(second)
        await trio.sleep(5)  # let the engine settle the withdrawn request
        stats = rt.statistics()
    assert [(r.step, len(r.token_ids)) for r in replies] == [(0, 256)]
    assert (stats.calls_in_flight, stats.leases) == (0, 0)


async def test_torch_an_until_that_raises_fails_its_own_call_alone():
    config = pbkv.RuntimeConfig(engine="torch", check_integrity=True, host_kv_tokens=0)

    def faulty(token: int) -> bool:
        raise ZeroDivisionError("stop check failed")

    async with pbkv.open_runtime(config) as rt, rt.workflow() as wf:
        replies = []

        async def good() -> None:
            replies.append(await wf.call("w", chat("Write a poem."), max_new_tokens=12))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(good)
                with pytest.raises(ZeroDivisionError, match="stop check failed"):
                    await wf.call("w", chat("Write a story."), max_new_tokens=12, until=faulty)
        assert [len(r.token_ids) for r in replies] == [12]
        assert rt.system.statistics()["engine"].restarts == 0
        assert rt.statistics().leases == 0
