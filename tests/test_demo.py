"""pbkv/demo.py's parts that need no model: the tasks' reference and the repeats' report."""

from __future__ import annotations

import pytest
from rich.console import Console

from pbkv.bench.compare import PolicyResult
from pbkv.demo import (
    DemoConfig,
    DemoResult,
    DemoRun,
    first_runs,
    gain_verdict,
    repeats_table,
    with_reference,
)
from pbkv.examples.live_codegen import live_codegen_tasks
from pbkv.kvmanager import KVStatistics


def test_each_task_carries_its_own_module_reference_before_its_request() -> None:
    tasks = live_codegen_tasks(3)
    carried = with_reference(tasks, 100)
    assert [t.task_id for t in carried] == [t.task_id for t in tasks]
    for task, with_doc, module in zip(
        tasks, carried, ("string", "textwrap", "itertools"), strict=True
    ):
        assert with_doc.text.startswith(f"Reference (the {module} module, which you may use):")
        assert with_doc.text.endswith(task.text)
        assert 300 < len(with_doc.text) - len(task.text) <= 400 + 80
        assert with_doc.features == task.features  # the tester still finds the problem
    assert with_reference(tasks, 0) == tasks


def run(policy: str, repeat: int, wall_s: float) -> DemoRun:
    """A run of ``policy`` that took ``wall_s`` (and half that in CPU time)."""
    result = PolicyResult(
        policy=policy,
        predictor="-",
        workflows=4,
        failed_workflows=0,
        mean_latency_s=1.0,
        p50_latency_s=1.0,
        p99_latency_s=1.0,
        mean_ttft_s=0.1,
        gpu_hit_rate=0.5,
        host_hit_rate=0.0,
        total_hit_rate=0.5,
        recomputed_tokens=1000,
        throughput_workflows_per_s=1.0,
        makespan_s=wall_s,
        kv=KVStatistics(policy, *([0] * 16)),
        wall_s=wall_s,
        cpu_s=wall_s / 2,
    )
    return DemoRun(policy, result, (), None, repeat)


def demo_of(runs: list[DemoRun], policies: tuple[str, ...] = ("lru", "pbkv")) -> DemoResult:
    config = DemoConfig(model="tiny", policies=policies, repeats=3)
    return DemoResult("tiny", "cpu", ("add",), 512, 256, tuple(runs), config)


def test_the_gain_is_above_the_noise_only_when_the_runs_do_not_overlap() -> None:
    apart = demo_of(
        [run("lru", 0, 10.0), run("pbkv", 0, 8.0), run("pbkv", 1, 8.5), run("lru", 1, 10.5)]
        + [run("lru", 2, 9.5), run("pbkv", 2, 7.5)]
    )
    assert [r.repeat for r in first_runs(apart)] == [0, 0]
    assert "pbkv: 0.80x lru's mean wall time (1.25x speedup); every run faster" in gain_verdict(
        apart
    )
    overlap = demo_of(
        [run("lru", 0, 10.0), run("pbkv", 0, 8.0), run("pbkv", 1, 10.2), run("lru", 1, 9.0)]
        + [run("lru", 2, 9.5), run("pbkv", 2, 9.0)]
    )
    assert "within the noise" in gain_verdict(overlap)
    slower = demo_of(
        [run("lru", 0, 10.0), run("pbkv", 0, 12.0), run("pbkv", 1, 12.5), run("lru", 1, 9.0)]
        + [run("lru", 2, 9.5), run("pbkv", 2, 11.0)]
    )
    assert "every run slower than every lru run: the loss is above the noise" in gain_verdict(
        slower
    )
    console = Console(width=120, record=True)
    console.print(repeats_table(apart))
    text = console.export_text()
    assert (
        "(mean [min–max]; x lru" in text
        and "10.0 [9.5–10.5]" in text
        and "0.80 [0.79–0.81]" in text
    )


def test_a_pbkv_row_is_also_set_against_the_strongest_baseline() -> None:
    rows = ("lru", "lru:workflow", "pbkv")
    demo = demo_of(
        [run("lru", 0, 10.0), run("lru:workflow", 0, 7.0), run("pbkv", 0, 6.9)]
        + [run("pbkv", 1, 7.1), run("lru", 1, 10.5), run("lru:workflow", 1, 7.2)],
        rows,
    )
    lines = gain_verdict(demo).splitlines()
    assert lines[0].startswith("lru:workflow: 0.69x lru's mean wall time (1.44x speedup); every")
    assert lines[1].startswith("pbkv: 0.68x lru's mean wall time (1.46x speedup); every run")
    assert lines[2] == (
        "pbkv: 0.99x lru:workflow's mean wall time (1.01x speedup); the runs overlap (mean "
        "spread 0.2 s): within the noise"
    )
    assert len(lines) == 3
    # no baseline but the first: nothing more to say; one run each: no verdict on the noise
    (line,) = gain_verdict(demo_of([run("lru", 0, 2.0), run("pbkv", 0, 1.0)])).splitlines()
    assert line.endswith(
        "(2.00x speedup); one run each, no spread to judge the noise by (--repeats 3)"
    )


def test_a_demo_row_may_name_its_scheduler_as_the_bench_does() -> None:
    assert DemoConfig(policies=("lru", "pbkv:fcfs", "lru:workflow")).policies[1] == "pbkv:fcfs"
    with pytest.raises(ValueError, match="unknown scheduler 'nope'; known: fcfs"):
        DemoConfig(policies=("pbkv:nope",))
    with pytest.raises(ValueError, match="unknown policy"):
        DemoConfig(policies=("nope:fcfs",))


def test_each_row_runs_the_scheduler_its_spec_names() -> None:
    """``pbkv:fcfs`` serves pbkv's policy with FCFS admission, a bare ``pbkv`` its
    default ``workflow``; each run is reported under its spec."""
    import torch

    from pbkv.demo import run_demo
    from pbkv.engines.torchengine import load_model

    torch.manual_seed(0)
    config = DemoConfig(
        model="tiny",
        policies=("pbkv:fcfs", "pbkv"),
        workflows=2,
        concurrency=2,
        code_tokens=8,
        context_tokens=0,
    )
    demo = run_demo(config, model=load_model("tiny", device="cpu"))
    assert [(r.policy, r.result.policy, r.result.scheduler) for r in demo.runs] == [
        ("pbkv:fcfs", "pbkv", "fcfs"),
        ("pbkv", "pbkv", "workflow"),
    ]


def test_a_demo_config_refuses_a_row_named_twice_and_budgets_below_one() -> None:
    with pytest.raises(ValueError, match="lru:fcfs twice"):
        DemoConfig(policies=("lru", "lru:fcfs"))
    with pytest.raises(ValueError, match="a tuple of names"):
        DemoConfig(policies="pbkv")  # type: ignore[arg-type]
    for field, value in (("code_tokens", 0), ("max_retries", -1), ("gpu_kv_tokens", 0)):
        with pytest.raises(ValueError, match=field):
            DemoConfig(**{field: value})
