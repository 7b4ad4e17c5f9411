"""PredictorActor: batching bounds in virtual time, worker threads, graphsage → markov fallback."""

import time

import numpy as np
import pytest
import trio

from pbkv.actors.events import ForecastRequest
from pbkv.actors.predictor import PredictorActor, PredictorStatistics
from pbkv.predictor import (
    END,
    CallGraph,
    MarkovForecaster,
    TraceRecord,
    TraceStep,
    WorkflowState,
)
from pbkv.predictor.trace import TRACE_VERSION, SegmentCount
from pbkv.runtime import open_actor_system

AGENTS = ("planner", "coder", "tester")
GRAPH = CallGraph(
    AGENTS, [("planner", "coder"), ("coder", "tester"), ("tester", "coder"), ("tester", END)]
)


def probabilities(reply: object) -> object:
    """A reply's forecast array (``None`` stays ``None``); its columns are checked apart."""
    return None if reply is None else reply.probabilities  # type: ignore[attr-defined]


class Recording:
    """Uniform forecasts; records the virtual time and workflow ids of each batch."""

    name = "recording"
    agents = AGENTS
    horizon = 2

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[str]]] = []

    def forecast(self, states):
        try:
            now = trio.current_time()
        except RuntimeError:  # in a worker thread
            now = -1.0
        self.batches.append((now, [s.workflow_id for s in states]))
        return np.full((len(states), 2, len(AGENTS) + 1), 1.0 / (len(AGENTS) + 1))


async def ask_at(actor: PredictorActor, times_s: list[float]) -> dict[int, object]:
    """Send request ``w{i}`` at virtual time ``times_s[i]``; collect the replies."""
    replies: dict[int, object] = {}

    async def one(i: int) -> None:
        send, receive = trio.open_memory_channel(1)
        await trio.sleep_until(start + times_s[i])
        await actor.ref.tell(ForecastRequest(f"w{i}", "demo", ("planner",), reply=send))
        replies[i] = probabilities(await receive.receive())

    async with open_actor_system() as system:
        await system.spawn(actor, name="predictor")
        start = trio.current_time()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(len(times_s)):
                    nursery.start_soon(one, i)
    return replies


async def test_the_oldest_request_waits_at_most_max_wait(autojump_clock):
    model = Recording()
    actor = PredictorActor([model], max_wait_s=0.010)
    # a steady stream, 4 ms apart: without a deadline from the oldest request it would
    # never flush before max_batch
    replies = await ask_at(actor, [0.000, 0.004, 0.008, 0.012, 0.016, 0.020, 0.024])
    assert len(replies) == 7
    starts = [t for t, _ in model.batches]
    groups = [ids for _, ids in model.batches]
    assert groups == [["w0", "w1", "w2"], ["w3", "w4", "w5"], ["w6"]]
    assert np.diff([0.0, *starts]) == pytest.approx([0.010, 0.012, 0.012])


class Slow(Recording):
    def forecast(self, states):
        time.sleep(0.05)  # a model that takes wall time, in the worker thread
        return super().forecast(states)


async def test_requests_queued_while_the_model_runs_form_the_next_batch():
    model = Slow()
    actor = PredictorActor([model], run_in_thread=True)
    replies = {}

    async def one(i: int) -> None:
        send, receive = trio.open_memory_channel(1)
        await actor.ref.tell(ForecastRequest(f"w{i}", "demo", ("planner",), reply=send))
        replies[i] = probabilities(await receive.receive())

    async with open_actor_system() as system:
        await system.spawn(actor, name="predictor")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
                    await trio.sleep(0)
    assert len(replies) == 20
    assert all(t == -1.0 for t, _ in model.batches)  # every call ran off the event loop
    assert sorted(w for _, ids in model.batches for w in ids) == sorted(f"w{i}" for i in range(20))
    stats = actor.predictor_statistics()
    assert stats.requests == 20 and stats.batches == len(model.batches) <= 3


def trace(*agents: str) -> TraceRecord:
    steps = [TraceStep(a, [SegmentCount("role", 8)], 4) for a in agents]
    return TraceRecord(version=TRACE_VERSION, app="demo", task_id="t", task_text="x", steps=steps)


async def test_graphsage_failure_falls_back_to_markov_then_recovers(autojump_clock):
    from pbkv.predictor.graphsage import GraphSageConfig
    from pbkv.predictor.graphsage_forecaster import GraphSageForecaster
    from pbkv.predictor.train import TrainConfig, fit_graphsage

    records = [trace("planner", "coder", "tester")] * 4
    small = GraphSageConfig(horizon=2, agent_dim=4, hidden_dim=8, mlp_dim=8, attention_heads=2)
    result = fit_graphsage(records, GRAPH, config=small, train=TrainConfig(epochs=1))
    graphsage = GraphSageForecaster(result.model, AGENTS)
    markov = MarkovForecaster(AGENTS, horizon=2, graph=GRAPH).fit(records)

    def on_fire(states):
        raise RuntimeError("injected model failure")

    graphsage.forecast = on_fire  # type: ignore[method-assign]
    actor = PredictorActor([graphsage, markov])
    replies = await ask_at(actor, [0.0, 0.0, 0.0])
    expected = markov.forecast([WorkflowState("w", "demo", ("planner",))])[0]
    assert len(replies) == 3
    for forecast in replies.values():
        np.testing.assert_allclose(forecast, expected)
    assert actor.predictor_statistics() == PredictorStatistics(
        requests=3, batches=1, max_batch=3, fallbacks=1, failures=1, unanswered=0
    )
    del graphsage.forecast  # the class's forecast again
    actor = PredictorActor([graphsage, markov])
    replies = await ask_at(actor, [0.0])
    assert replies[0].shape == (2, 4)
    assert actor.predictor_statistics().fallbacks == 0


async def test_every_failure_is_counted_and_answered_with_none(autojump_clock):
    class Broken(Recording):
        def forecast(self, states):
            raise RuntimeError("down")

    actor = PredictorActor([Broken(), Broken()])
    replies = await ask_at(actor, [0.0, 0.0, 0.5])
    assert replies == {0: None, 1: None, 2: None}
    assert actor.predictor_statistics() == PredictorStatistics(
        requests=3, batches=2, max_batch=2, fallbacks=2, failures=4, unanswered=3
    )


def test_bad_configuration_is_refused():
    class Other(Recording):
        agents = ("planner", "coder")

    with pytest.raises(ValueError, match="share one agent vocabulary"):
        PredictorActor([Recording(), Other()])
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        PredictorActor([Recording()], max_batch=0)
    with pytest.raises(ValueError, match="max_wait_s must be >= 0"):
        PredictorActor([Recording()], max_wait_s=-1.0)
