"""Live runs recorded as predictor traces (actors/traces.py): they load and train markov."""

import pbkv
from pbkv.actors.events import LifecycleEvent, WorkflowTerminated
from pbkv.actors.traces import TraceRecorder, segment_kinds
from pbkv.live import State
from pbkv.predictor import make_forecaster
from pbkv.predictor.base import WorkflowState
from pbkv.predictor.trace import END, read_traces
from pbkv.runtime import EventRecorder, EventTee, read_events


def retry_app() -> pbkv.App:
    """writer → checker ⇒ {writer (retry), END}: the checker passes on the task's 2nd try
    for tasks named ``hard-*`` and on the 1st otherwise (its simulated replies)."""

    def verdict(state: State) -> pbkv.Simulated:
        hard = state.task.task_id.startswith("hard")
        ok = state.visits["checker"] >= (1 if hard else 0)
        return pbkv.Simulated("PASS" if ok else "FAIL", 12)

    async def lint(state: State) -> str:
        return "lint clean"

    app = pbkv.App("retry", preamble="You are one agent of a small team. " * 6)
    app.agent("writer", role="Write the text.", simulate=lambda s: pbkv.Simulated("draft", 24))
    app.tool("lint", lint, simulate=lambda s: ("lint clean", 0.5))
    app.agent("checker", role="Check it; say PASS or FAIL.", simulate=verdict)
    app.edge(pbkv.START, "writer").edge("writer", "lint").edge("lint", "checker")
    app.route(
        "checker",
        lambda state, out: pbkv.END if "PASS" in out.text else "writer",
        ["writer", pbkv.END],
    )
    return app


def test_segment_kinds_follow_how_prompts_are_built():
    assert segment_kinds(1) == ["context"]
    assert segment_kinds(2) == ["preamble", "context"]
    assert segment_kinds(3) == ["preamble", "role", "context"]


async def test_a_recorded_live_run_loads_and_trains_markov(autojump_clock, tmp_path):
    app = retry_app()
    tasks = [
        pbkv.LiveTask(f"{kind}-{i}", f"Task {i}.") for i in range(3) for kind in ("hard", "easy")
    ]
    traces, events = tmp_path / "runs.jsonl", tmp_path / "events.jsonl"
    with TraceRecorder(traces) as recorder, EventRecorder(events) as log:
        config = pbkv.RuntimeConfig(engine="sim", check_integrity=True)
        async with pbkv.open_runtime(config, recorder=EventTee(log, recorder)) as rt:
            outcomes = await pbkv.serve_app(rt, app, tasks, concurrency=3)
    assert recorder.open_workflows == ()
    terminated = [
        e for e in read_events(events, LifecycleEvent) if isinstance(e, WorkflowTerminated)
    ]
    assert len(terminated) == len(tasks)  # the event log got the same events

    loaded = read_traces(traces, strict=True).records
    assert len(loaded) == recorder.written == len(tasks)
    by_task = {r.task_id: r for r in loaded}
    paths = {o.workflow_id: o.path for o in outcomes}
    for i, task in enumerate(tasks):
        record = by_task[task.task_id]
        assert record.agents == paths[f"retry-{i}"]
        hard = task.task_id.startswith("hard")
        expected = ("writer", "checker") * (2 if hard else 1)
        assert record.agents == expected and record.end_reason == "end"
        assert record.app == "retry" and record.task_text == task.text
        assert [s.kind for s in record.steps[0].segments] == ["preamble", "role", "context"]
        assert all(s.output_tokens > 0 for s in record.steps)
        checker = record.steps[1]
        assert checker.gap_s >= 0.5  # the lint tool's modelled latency before the checker
        assert record.steps[0].gap_s < 0.5

    markov = make_forecaster("markov", agents=app.agents, horizon=2, traces=loaded)
    (forecast,) = markov.forecast([WorkflowState("w", "retry", ("writer", "checker"))])
    columns = {a: i for i, a in enumerate((*app.agents, END))}
    # 9 checker steps: 3 hard tasks' first verdicts sent them back to the writer
    assert abs(forecast[0, columns[END]] - 2 / 3) < 1e-9  # 6 ends over 9 checker steps
    assert abs(forecast[0, columns["writer"]] - 1 / 3) < 1e-9
