"""PredictorActor: batching of concurrent forecast requests and the fallback chain (§6, §10)."""

import numpy as np
import pytest
import trio

from pbkv.actors.events import ForecastRequest
from pbkv.actors.predictor import PredictorActor, PredictorStatistics
from pbkv.predictor.base import WorkflowState
from pbkv.runtime import open_actor_system

from .conftest import AGENTS

HORIZON = 2


def probabilities(reply: object) -> object:
    """A reply's forecast array (``None`` stays ``None``); its columns are checked apart."""
    return None if reply is None else reply.probabilities  # type: ignore[attr-defined]


class Counting:
    """Forecasts ``P^(1)[planner] = i / 100`` for workflow ``w{i}``; records each batch."""

    name = "counting"
    agents = AGENTS
    horizon = HORIZON

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def forecast(self, states):
        self.batches.append([s.workflow_id for s in states])
        out = np.zeros((len(states), HORIZON, len(AGENTS) + 1))
        for b, state in enumerate(states):
            p = int(state.workflow_id[1:]) / 100
            out[b, :, 0] = p
            out[b, :, -1] = 1.0 - p
        return out


class Raising:
    name = "broken"
    agents = AGENTS
    horizon = HORIZON

    def __init__(self) -> None:
        self.calls = 0

    def forecast(self, states):
        self.calls += 1
        raise RuntimeError("model on fire")


async def ask_all(actor: PredictorActor, n: int, *, spacing_s: float = 0.0) -> dict[int, object]:
    """Send ``n`` forecast requests from ``n`` tasks, ``spacing_s`` apart; collect replies."""
    replies: dict[int, object] = {}

    async def one(i: int) -> None:
        send, receive = trio.open_memory_channel(1)
        await trio.sleep(spacing_s * i)
        await actor.ref.tell(ForecastRequest(f"w{i}", "demo", ("planner",), reply=send))
        replies[i] = probabilities(await receive.receive())

    async with open_actor_system() as system:
        await system.spawn(actor, name="predictor")
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(one, i)
    return replies


def assert_counting_replies(replies: dict[int, object]) -> None:
    for i, forecast in replies.items():
        assert forecast.shape == (HORIZON, len(AGENTS) + 1)
        assert forecast[0, 0] == pytest.approx(i / 100)  # each reply went to its asker


async def test_concurrent_requests_are_merged_into_one_batch(autojump_clock):
    model = Counting()
    actor = PredictorActor([model])
    replies = await ask_all(actor, 8)
    assert_counting_replies(replies)
    assert len(replies) == 8
    assert actor.predictor_statistics() == PredictorStatistics(
        requests=8, batches=1, max_batch=8, fallbacks=0, failures=0
    )
    assert sorted(model.batches[0]) == [f"w{i}" for i in range(8)]


async def test_requests_within_max_wait_share_a_batch(autojump_clock):
    model = Counting()
    actor = PredictorActor([model], max_wait_s=0.01)
    replies = await ask_all(actor, 5, spacing_s=0.001)
    assert_counting_replies(replies)
    assert model.batches == [["w0", "w1", "w2", "w3", "w4"]]


async def test_spaced_requests_without_waiting_go_alone(autojump_clock):
    model = Counting()
    actor = PredictorActor([model])
    await ask_all(actor, 3, spacing_s=0.001)
    assert model.batches == [["w0"], ["w1"], ["w2"]]
    assert actor.predictor_statistics().batches == 3


async def test_max_batch_caps_a_batch(autojump_clock):
    model = Counting()
    actor = PredictorActor([model], max_batch=3)
    replies = await ask_all(actor, 7)
    assert_counting_replies(replies)
    assert [len(b) for b in model.batches] == [3, 3, 1]
    assert actor.predictor_statistics().max_batch == 3


async def test_a_failing_model_falls_back_to_the_next(autojump_clock):
    broken, model = Raising(), Counting()
    actor = PredictorActor([broken, model])
    replies = await ask_all(actor, 4)
    assert_counting_replies(replies)
    assert broken.calls == 1 and len(model.batches) == 1
    assert actor.predictor_statistics() == PredictorStatistics(
        requests=4, batches=1, max_batch=4, fallbacks=1, failures=1
    )


class Malformed:
    """Returns a NaN forecast for even workflows and a negative one for ``w1``."""

    name = "malformed"
    agents = AGENTS
    horizon = HORIZON

    def forecast(self, states):
        out = np.zeros((len(states), HORIZON, len(AGENTS) + 1))
        out[:, :, -1] = 1.0
        for b, state in enumerate(states):
            i = int(state.workflow_id[1:])
            if i % 2 == 0:
                out[b, 0, 0] = np.nan
            elif i == 1:
                out[b, 0, :2] = (-3.0, 3.0)
        return out


async def test_malformed_forecasts_are_rejected_and_fall_back(autojump_clock, caplog):
    actor = PredictorActor([Malformed(), Counting()])
    replies = await ask_all(actor, 5)
    assert all(np.isfinite(f).all() and (f >= 0).all() for f in replies.values())
    for i in (0, 1, 2, 4):  # answered by the fallback
        assert replies[i][0, 0] == pytest.approx(i / 100)
    assert replies[3][0, -1] == 1.0  # the first model's well-formed forecast stands
    stats = actor.predictor_statistics()
    assert (stats.rejected, stats.fallbacks, stats.failures, stats.unanswered) == (4, 1, 0, 0)
    assert caplog.text.count("malformed: rejected forecast for w") == 4


async def test_when_every_model_fails_the_reply_is_none(autojump_clock):
    first, second = Raising(), Raising()
    actor = PredictorActor([first, second])
    replies = await ask_all(actor, 3)
    assert replies == {0: None, 1: None, 2: None}
    assert (first.calls, second.calls) == (1, 1)
    stats = actor.predictor_statistics()
    assert (stats.failures, stats.fallbacks) == (2, 1)


async def test_a_requester_that_left_does_not_stop_the_actor(autojump_clock):
    model = Counting()
    actor = PredictorActor([model])
    async with open_actor_system() as system:
        ref = await system.spawn(actor, name="predictor")
        gone_send, gone_receive = trio.open_memory_channel(1)
        gone_receive.close()
        await ref.tell(ForecastRequest("w1", "demo", ("planner",), reply=gone_send))
        send, receive = trio.open_memory_channel(1)
        await ref.tell(ForecastRequest("w2", "demo", ("coder",), reply=send))
        with trio.fail_after(60):
            forecast = probabilities(await receive.receive())
    assert forecast[0, 0] == pytest.approx(0.02)
    assert actor.predictor_statistics().requests == 2


def test_an_empty_chain_is_refused():
    with pytest.raises(ValueError, match="at least one forecaster"):
        PredictorActor([])


async def test_the_step_text_reaches_the_model(autojump_clock):
    seen = []

    class Recording(Counting):
        def forecast(self, states):
            seen.extend((s.task_text, s.context_tail) for s in states)
            return super().forecast(states)

    actor = PredictorActor([Recording()])
    async with open_actor_system() as system:
        await system.spawn(actor, name="predictor")
        send, receive = trio.open_memory_channel(1)
        request = ForecastRequest(
            "w1", "demo", ("planner",), "task", reply=send, context_tail="user: please rebook"
        )
        await actor.ref.tell(request)
        probabilities(await receive.receive())
    assert seen == [("task", "user: please rebook")]


def trained_markov():
    from pbkv.predictor import make_forecaster
    from pbkv.predictor.trace import TRACE_VERSION, TraceRecord, TraceStep

    def trace(*agents: str) -> TraceRecord:
        steps = [TraceStep(a, [], 1) for a in agents]
        return TraceRecord(TRACE_VERSION, "demo", "t", "", steps)

    traces = [trace("planner", "coder", "tester"), trace("planner", "coder", "tester", "coder")]
    return make_forecaster("markov", agents=AGENTS, horizon=HORIZON, traces=traces)


async def ask_paths(actor: PredictorActor, paths: list[tuple[str, ...]]) -> list[object]:
    """Send one request per path at once (one batch); return the replies in order."""
    replies: list[object] = [None] * len(paths)

    async def one(i: int) -> None:
        send, receive = trio.open_memory_channel(1)
        await actor.ref.tell(ForecastRequest(f"w{i}", "demo", paths[i], reply=send))
        replies[i] = probabilities(await receive.receive())

    async with open_actor_system() as system:
        await system.spawn(actor, name="predictor")
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(len(paths)):
                    nursery.start_soon(one, i)
    return replies


async def test_an_unknown_agent_leaves_the_other_workflows_forecasts_intact(autojump_clock, caplog):
    markov = trained_markov()
    actor = PredictorActor([markov, trained_markov()])
    paths = [("planner",), ("planner", "stranger"), ("planner", "coder"), ("stranger",)]
    replies = await ask_paths(actor, paths)
    expected = markov.forecast([WorkflowState("x", "demo", p) for p in (paths[0], paths[2])])
    np.testing.assert_array_equal(replies[0], expected[0])
    np.testing.assert_array_equal(replies[2], expected[1])
    assert replies[1] is None and replies[3] is None
    stats = actor.predictor_statistics()
    assert (stats.batches, stats.failures, stats.fallbacks, stats.unanswered) == (1, 0, 0, 0)
    assert (stats.unknown_agent_requests, stats.unknown_agents) == (2, ("stranger",))
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "'stranger'" in warnings[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)


class RefusesOne(Counting):
    """Counting, but refuses (ValueError, the interface's bad-input error) workflow w1."""

    def forecast(self, states):
        if any(s.workflow_id == "w1" for s in states):
            raise ValueError("workflow 'w1': hidden has 3 values, the model takes 8")
        return super().forecast(states)


async def test_a_state_the_model_refuses_costs_only_its_own_forecast(autojump_clock):
    first, second = RefusesOne(), Counting()
    actor = PredictorActor([first, second])
    replies = await ask_all(actor, 4)
    assert_counting_replies(replies)  # w1 answered by the fallback, the rest by the first
    assert sorted(first.batches) == [["w0"], ["w2"], ["w3"]] and second.batches == [["w1"]]
    stats = actor.predictor_statistics()
    assert (stats.failures, stats.fallbacks, stats.unanswered) == (1, 1, 0)
