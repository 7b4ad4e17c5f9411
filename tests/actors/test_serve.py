"""Workflows served end to end through the actor system on the sim engine, in virtual time
(§4, §10): lifecycle order, leases, retirement, retries and engine failures."""

import pytest
import trio

from pbkv.actors.events import (
    AgentFinished,
    AgentInvoked,
    LifecycleEvent,
    PrefillDone,
    WorkflowStarted,
    WorkflowTerminated,
)
from pbkv.actors.serve import serve_workflows
from pbkv.engines.base import EngineError
from pbkv.predictor import UniformForecaster
from pbkv.runtime import EventRecorder, read_events

from .conftest import AGENTS, make_engine, make_kv, make_workflow

PATHS = {
    "wf0": ("planner", "coder", "tester"),
    "wf1": ("planner", "coder"),
    "wf2": ("planner", "coder", "tester", "coder", "tester"),
}


def workload(gap_s: float = 0.0):
    return [make_workflow(i, PATHS[f"wf{i}"], gap_s=gap_s) for i in range(3)]


def assert_released(kv):
    kv.check_integrity()
    assert kv.tree.private_blocks("gpu") == 0
    assert all(n.lock_count == 0 for n in kv.tree.nodes())


def by_workflow(events):
    out = {}
    for e in events:
        out.setdefault(e.workflow_id, []).append(e)
    return out


@pytest.mark.parametrize("policy", ["lru", "pbkv"])
async def test_workflows_run_to_the_end_with_ordered_lifecycle(autojump_clock, tmp_path, policy):
    kv = make_kv(policy)
    workflows = workload(gap_s=0.05)
    path = tmp_path / "events.jsonl"
    with trio.fail_after(600), EventRecorder(path) as recorder:
        outcomes = await serve_workflows(
            workflows,
            engine=make_engine(kv),
            kv=kv,
            forecasters=[UniformForecaster(AGENTS, horizon=3)],
            recorder=recorder,
        )
    assert sorted(o.workflow_id for o in outcomes) == ["wf0", "wf1", "wf2"]
    assert {o.reason for o in outcomes} == {"end"}
    for o in outcomes:
        assert len(o.results) == len(PATHS[o.workflow_id])
        assert o.latency_s == pytest.approx(o.end_s - o.start_s) and o.latency_s > 0

    events = by_workflow(read_events(path, LifecycleEvent))
    assert sorted(events) == ["wf0", "wf1", "wf2"]
    specs = {w.workflow_id: w for w in workflows}
    results = {o.workflow_id: o.results for o in outcomes}
    for w, seq in events.items():
        steps = specs[w].steps
        expected = [WorkflowStarted]
        expected += [AgentInvoked, PrefillDone, AgentFinished] * len(steps)
        expected += [WorkflowTerminated]
        assert [type(e) for e in seq] == expected, w
        assert seq[0] == WorkflowStarted(
            w, "demo", specs[w].task_id, "", seq[0].at_s, "task text " + w[2:]
        )
        assert seq[-1].reason == "end"
        triples = zip(seq[1:-1:3], seq[2:-1:3], seq[3:-1:3], strict=True)
        for s, (invoked, prefill, finished) in enumerate(triples):
            assert (invoked.step, invoked.agent) == (s, steps[s].agent)
            assert invoked.prompt_segments == [len(g.token_ids) for g in steps[s].segments]
            r = results[w][s]
            assert (prefill.step, prefill.cached_gpu_tokens, prefill.cached_host_tokens) == (
                s,
                r.cached_gpu_tokens,
                r.cached_host_tokens,
            )
            assert prefill.computed_tokens == r.computed_tokens
            assert (finished.step, finished.agent, finished.output_tokens) == (s, steps[s].agent, 4)
            assert finished.latency_s == r.e2e_s and finished.ttft_s == r.ttft_s
        times = [e.at_s for e in seq]
        assert times == sorted(times)

    s = kv.statistics()
    assert s.requests == sum(len(p) for p in PATHS.values())
    assert s.cached_gpu_tokens > 0  # later steps reuse the preamble, role and context
    assert_released(kv)
    nodes = kv.tree.nodes()
    assert nodes and all(n.retired and n.score == 0.0 and not n.accessors for n in nodes)
    assert kv.scores.active_workflows == []


async def test_predictor_sees_each_workflows_path(autojump_clock):
    seen = []

    class Recording(UniformForecaster):
        def forecast(self, states):
            seen.extend((s.workflow_id, s.path) for s in states)
            return super().forecast(states)

    kv = make_kv("pbkv")
    with trio.fail_after(600):
        await serve_workflows(
            [make_workflow(0, PATHS["wf0"])],
            engine=make_engine(kv),
            kv=kv,
            forecasters=[Recording(AGENTS, horizon=3)],
        )
    assert seen == [
        ("wf0", ("planner",)),
        ("wf0", ("planner", "coder")),
        ("wf0", ("planner", "coder", "tester")),
    ]


class FailingEngine:
    """An engine whose every request fails after a little virtual time."""

    owns_cache = True
    has_host_tier = False
    has_hidden_state = False

    def __init__(self, fail_first: int | None = None, inner=None) -> None:
        self.calls = 0
        self.fail_first = fail_first
        self.inner = inner

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        if self.inner is not None:
            await self.inner.run(task_status=task_status)
            return
        task_status.started()
        await trio.sleep_forever()

    async def generate(self, request):
        self.calls += 1
        if self.fail_first is None or self.calls <= self.fail_first:
            await trio.sleep(0.01)
            raise EngineError(f"request {request.request_id}: device lost")
        return await self.inner.generate(request)

    def statistics(self):
        return None


async def test_engine_failure_retries_then_ends_with_error(autojump_clock, tmp_path):
    kv = make_kv("lru")
    engine = FailingEngine()
    path = tmp_path / "events.jsonl"
    with trio.fail_after(60), EventRecorder(path) as recorder:
        outcomes = await serve_workflows(
            [make_workflow(0, PATHS["wf0"])], engine=engine, kv=kv, recorder=recorder
        )
    [outcome] = outcomes
    assert (outcome.workflow_id, outcome.reason, outcome.results) == ("wf0", "error", ())
    assert engine.calls == 2  # the first try and one retry (max_retries=1)
    events = read_events(path, LifecycleEvent)
    assert [type(e).__name__ for e in events] == [
        "WorkflowStarted",
        "AgentInvoked",
        "AgentInvoked",
        "WorkflowTerminated",
    ]
    assert [e.step for e in events[1:3]] == [0, 0]
    assert events[-1].reason == "error"
    assert_released(kv)


async def test_one_failure_is_retried_and_the_workflow_ends(autojump_clock):
    kv = make_kv("pbkv")
    seen = []

    class Recording(UniformForecaster):
        def forecast(self, states):
            seen.extend(s.path for s in states)
            return super().forecast(states)

    engine = FailingEngine(fail_first=1, inner=make_engine(kv))
    with trio.fail_after(600):
        [outcome] = await serve_workflows(
            [make_workflow(0, PATHS["wf1"])],
            engine=engine,
            kv=kv,
            forecasters=[Recording(AGENTS, horizon=3)],
        )
    assert outcome.reason == "end" and len(outcome.results) == 2
    assert engine.calls == 3
    # the retried step is still one step of the path
    assert seen == [("planner",), ("planner",), ("planner", "coder")]
    assert_released(kv)


async def test_some_workflows_fail_others_finish(autojump_clock):
    kv = make_kv("lru")
    inner = make_engine(kv)

    class PickyEngine(FailingEngine):
        async def generate(self, request):
            self.calls += 1
            if request.workflow_id == "wf1":
                raise EngineError("refused")
            return await inner.generate(request)

    with trio.fail_after(600):
        outcomes = await serve_workflows(
            workload(), engine=PickyEngine(inner=inner), kv=kv, concurrency=2
        )
    assert {o.workflow_id: o.reason for o in outcomes} == {
        "wf0": "end",
        "wf1": "error",
        "wf2": "end",
    }
    assert_released(kv)


async def test_serve_rejects_bad_arguments(autojump_clock):
    kv = make_kv("lru")
    with pytest.raises(ValueError, match="concurrency"):
        await serve_workflows(workload(), engine=make_engine(kv), kv=kv, concurrency=0)
    twice = [make_workflow(0, ("planner",)), make_workflow(0, ("coder",))]
    with pytest.raises(ValueError, match="unique"):
        await serve_workflows(twice, engine=make_engine(kv), kv=kv)
    assert await serve_workflows([], engine=make_engine(kv), kv=kv) == []
