"""The gap models (``examples/gaps.py``): cited distributions, seeded, scaled, per app."""

import itertools
import math

import numpy as np
import pytest
import trio
import trio.testing

import pbkv
from pbkv.bench.compare import scale_gaps
from pbkv.examples import (
    CodegenApp,
    FinanceBenchApp,
    GroupChatApp,
    HoverApp,
    SwebenchApp,
    TauBenchApp,
    ToolLoopApp,
    taubench,
)
from pbkv.examples import gaps as g

APPS = [CodegenApp, FinanceBenchApp, GroupChatApp, HoverApp, SwebenchApp, TauBenchApp, ToolLoopApp]


def draws(distribution, n=40_000, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([distribution.quantile(float(u)) for u in rng.random(n)])


def gaps_of(workflows):
    return [[s.gap_s for s in w.steps] for w in workflows]


def calls_of(workflows):
    return [[(s.agent, s.segments, s.output_token_ids) for s in w.steps] for w in workflows]


@pytest.mark.parametrize(
    ("gap", "measured"),
    [  # (p50, p90) of the AgentCgroup traces, docs/gaps.md
        (g.SWE_TEST_RUN_S, (1.227, 6.377)),
        (g.SWE_SEARCH_S, (0.046, 1.198)),
        (g.SWE_EDIT_S, (0.044, 0.078)),
        (g.PYTHON_RUN_S, (0.940, 1.522)),
    ],
)
def test_empirical_gaps_keep_the_measured_median_and_p90(gap, measured):
    x = draws(gap.distribution)
    assert np.median(x) == pytest.approx(measured[0], rel=0.03)
    assert np.percentile(x, 90) == pytest.approx(measured[1], rel=0.05)
    assert x.min() >= gap.distribution.values[0] and x.max() <= gap.distribution.values[-1]


@pytest.mark.parametrize(
    ("gap", "p5_s", "p95_s"), [(g.WEB_SEARCH_S, 0.2, 1.0), (g.PAGE_FETCH_S, 2.0, 6.0)]
)
def test_vendor_ranges_are_the_5th_and_95th_percentiles(gap, p5_s, p95_s):
    x = draws(gap.distribution)
    assert np.percentile(x, [5, 95]) == pytest.approx([p5_s, p95_s], rel=0.04)
    assert np.median(x) == pytest.approx(math.sqrt(p5_s * p95_s), rel=0.03)


def test_human_rates_match_the_cited_figures():
    reading, typing = draws(g.READING_WPM), draws(g.TYPING_WPM)
    assert np.median(reading) == pytest.approx(238, rel=0.01)
    p5, p95 = np.percentile(reading, [5, 95])
    assert p95 / p5 == pytest.approx(300 / 175, rel=0.02)  # the range's width, about 238
    assert typing.mean() == pytest.approx(51.56, rel=0.02)
    assert typing.std() == pytest.approx(20.2, rel=0.05)


def test_empirical_quantiles_pass_through_their_knots_log_linearly():
    q = g.EmpiricalQuantiles((0.0, 0.5, 1.0), (1.0, 4.0, 16.0))
    assert [q.quantile(u) for u in (0.0, 0.25, 0.5, 0.75)] == pytest.approx([1, 2, 4, 8])
    assert q.quantile(0.999999) == pytest.approx(16.0, rel=1e-4)


@pytest.mark.parametrize(
    ("probabilities", "values"),
    [
        ((0.0, 1.0), (1.0,)),
        ((0.1, 1.0), (1.0, 2.0)),
        ((0.0, 1.0), (2.0, 1.0)),
        ((0.0, 1.0), (0, 1)),
    ],
)
def test_bad_quantile_knots_are_refused(probabilities, values):
    with pytest.raises(ValueError):
        g.EmpiricalQuantiles(probabilities, values)


def test_a_draw_is_seeded_and_rounded_to_milliseconds():
    a = [g.SWE_TEST_RUN_S.draw_s(np.random.default_rng(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2] == round(a[0], 3)
    assert g.SWE_TEST_RUN_S.draw_s(np.random.default_rng(8)) != a[0]


@pytest.mark.parametrize("cls", [HoverApp, TauBenchApp])
def test_an_unknown_gap_model_names_the_known_ones(cls):
    with pytest.raises(ValueError, match="bundled, cited"):
        cls(gap_model="measured")


@pytest.mark.parametrize("cls", APPS)
def test_cited_gaps_change_only_the_gaps_and_repeat_with_the_seed(cls):
    bundled = cls().generate(12, 3)
    cited = cls(gap_model="cited").generate(12, 3)
    assert cls(gap_model="bundled").generate(12, 3) == bundled
    assert calls_of(cited) == calls_of(bundled)
    assert gaps_of(cited) != gaps_of(bundled)
    assert cls(gap_model="cited").generate(12, 3) == cited
    assert gaps_of(cls(gap_model="cited").generate(12, 4)) != gaps_of(cited)


def test_hover_reader_gaps_follow_the_search_latency():
    workflows = HoverApp(gap_model="cited").generate(150, 0)
    bundled = HoverApp().generate(150, 0)
    reader = [s.gap_s for w in workflows for s in w.steps if s.agent == "reader"]
    others = [
        (s.gap_s, b.gap_s)
        for w, v in zip(workflows, bundled, strict=True)
        for s, b in zip(w.steps, v.steps, strict=True)
        if s.agent != "reader"
    ]
    assert len(reader) > 300
    assert np.median(reader) == pytest.approx(g.WEB_SEARCH_S.distribution.median, rel=0.1)
    assert all(cited == kept for cited, kept in others)  # uncited gaps keep the app's draw


def test_swebench_gaps_after_each_worker_come_from_its_tool():
    workflows = SwebenchApp(gap_model="cited").generate(60, 0)
    by_worker = {"localizer": [], "coder": [], "tester": [], "reviewer": []}
    for w in workflows:
        for before, step in itertools.pairwise(w.steps):  # a worker's tool, then the Manager
            if before.agent in by_worker:
                by_worker[before.agent].append(step.gap_s)
    assert by_worker["reviewer"] and max(by_worker["reviewer"]) <= 0.1  # no tool: uncited
    for worker, gap in g.CITED_GAPS["swebench"].items():
        knots = gap.distribution.values
        assert by_worker[worker] and all(knots[0] <= x <= knots[-1] for x in by_worker[worker])


def test_taubench_user_turns_wait_to_read_and_type(monkeypatch):
    monkeypatch.setattr(g.Typist, "draw", classmethod(lambda cls, rng: cls(240.0, 60.0)))
    app = TauBenchApp(gap_model="cited")
    [workflow] = app.generate(1, 0)
    [bundled] = TauBenchApp().generate(1, 0)
    users = [(s, b) for s, b in zip(workflow.steps, bundled.steps, strict=True)]
    assert any(s.agent == "user" for s, _ in users)
    for step, kept in users:
        if step.agent != "user":
            assert step.gap_s == kept.gap_s  # tool latencies stay uncited
            continue
        read, typed = taubench.user_turn_words(step)
        assert read > 0 and typed > 0
        assert step.gap_s == pytest.approx(60 * (read / 240 + typed / 60), abs=5e-4)


def test_gap_scale_multiplies_every_cited_gap():
    cited = SwebenchApp(gap_model="cited").generate(8, 0)
    scaled = scale_gaps(cited, 10.0)
    for gaps, scaled_gaps in zip(gaps_of(cited), gaps_of(scaled), strict=True):
        assert scaled_gaps == pytest.approx([10 * x for x in gaps], rel=1e-12)


def test_the_live_runtime_waits_the_cited_gaps_times_its_gap_scale():
    app = HoverApp(gap_model="cited")
    n, scale = 3, 10.0
    gap_sums = {
        f"hover-0-{i}": sum(s.gap_s for s in w.steps) for i, w in enumerate(app.generate(n, 0))
    }

    def latencies(gap_scale):
        async def main():
            async with pbkv.open_runtime(engine="sim", policy="lru", gap_scale=gap_scale) as rt:
                ids = list(gap_sums)
                tasks = [app.task(0, i) for i in range(n)]
                return await pbkv.serve_app(rt, app, tasks, concurrency=1, workflow_ids=ids)

        outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        return {o.workflow_id: o.end_s - o.start_s for o in outcomes}

    waited, unwaited = latencies(scale), latencies(0.0)
    for workflow_id, gap_s in gap_sums.items():
        assert waited[workflow_id] - unwaited[workflow_id] == pytest.approx(scale * gap_s, rel=1e-9)


def test_get_app_builds_a_bundled_app_with_the_cited_gaps_and_refuses_the_rest():
    from pbkv.examples import get_app

    cited = get_app("swebench", gap_model="cited").generate(8, 0)
    assert gaps_of(cited) == gaps_of(SwebenchApp(gap_model="cited").generate(8, 0))
    assert gaps_of(cited) != gaps_of(get_app("swebench").generate(8, 0))
    with pytest.raises(ValueError, match="known: bundled, cited"):
        get_app("swebench", gap_model="measured")
    with pytest.raises(ValueError, match="draws no gaps to cite"):
        get_app("mooncake", gap_model="cited")
    with pytest.raises(ValueError, match="for the bundled apps"):
        get_app("my_app:app", gap_model="cited")
