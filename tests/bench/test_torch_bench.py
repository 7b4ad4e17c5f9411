"""``pbkv bench --engine torch`` (pbkv/bench/torch_bench.py) on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

from pbkv.bench.compare import DEFAULT_POLICIES, BenchConfig
from pbkv.bench.replay_demo import WorkloadShrink
from pbkv.bench.torch_bench import (
    CALIBRATED_HARDWARE,
    CALIBRATED_MODEL,
    TORCH_POLICIES,
    TorchBenchConfig,
    bench_record,
    config_from_bench,
    engine_lines,
    run_torch_bench,
    torch_bench_table,
)
from pbkv.engines.torchengine import load_model


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return load_model("tiny", device="cpu")


def test_rows_run_in_rotated_order_with_every_figure_per_repeat(tiny) -> None:
    bench = BenchConfig(
        app="hover",
        policies=TORCH_POLICIES,
        workflows=2,
        concurrency=2,
        hardware=CALIBRATED_HARDWARE,
        model=CALIBRATED_MODEL,
    )
    shrink = WorkloadShrink(max_steps=3, output_tokens=2, gap_scale=0.0)
    config = TorchBenchConfig(bench, model="tiny", repeats=2, shrink=shrink)
    order: list[str] = []

    def on_outcome(spec: str, outcome) -> None:
        if not order or order[-1] != spec:
            order.append(spec)

    run = run_torch_bench(config, model=tiny, on_outcome=on_outcome)
    assert order == ["lru", "lru:workflow", "pbkv", "lru:workflow", "pbkv", "lru"]
    assert [row.spec for row in run.rows] == ["lru", "lru:workflow", "pbkv"]
    assert [row.runs[0].scheduler for row in run.rows] == ["fcfs", "workflow", "workflow"]
    for row in run.rows:
        assert len(row.runs) == len(row.engines) == 2
        for r, engine in zip(row.runs, row.engines, strict=True):
            assert r.workflows == 2 and r.failed_workflows == 0
            assert r.wall_s > 0 and r.cpu_s > 0
            kv = r.kv
            assert kv.prompt_tokens == (
                kv.cached_gpu_tokens + kv.cached_host_tokens + r.recomputed_tokens
            )
            assert engine.prefill_tokens >= r.recomputed_tokens and engine.forwards > 0
        assert row.predicted is not None and row.predicted.kv.requests == row.runs[0].kv.requests
    console = Console(width=140, record=True)
    console.print(torch_bench_table(run))
    for line in engine_lines(run):
        console.print(line)
    text = console.export_text()
    assert "mean ±(max−min)/2 over the repeats" in text
    assert f"sim prediction ({CALIBRATED_HARDWARE} x {CALIBRATED_MODEL}" in text
    assert json.loads(json.dumps(bench_record(run), default=str))["rows"][2]["spec"] == "pbkv"


def test_the_command_maps_the_sim_benchs_defaults_to_the_torch_ones() -> None:
    config = config_from_bench(BenchConfig(app="hover"), "qwen3-32b", repeats=3)
    assert config.bench.policies == TORCH_POLICIES != DEFAULT_POLICIES
    assert (config.bench.hardware, config.bench.model) == (CALIBRATED_HARDWARE, CALIBRATED_MODEL)
    assert config.model in ("smollm2", "tiny") and config.predict == (config.model == "smollm2")
    tiny = config_from_bench(BenchConfig(policies=("lru", "pbkv"), hardware="h200"), "tiny", 2)
    assert (tiny.model, tiny.predict, tiny.repeats) == ("tiny", False, 2)
    assert tiny.bench.policies == ("lru", "pbkv") and tiny.bench.hardware == "h200"
    # on a GPU the calibrated (CPU) profile predicts nothing; a named profile does
    gpu = config_from_bench(BenchConfig(app="hover"), "smollm2", 3, device="cuda")
    assert not gpu.predict and gpu.bench.hardware == CALIBRATED_HARDWARE
    named = config_from_bench(BenchConfig(app="hover", hardware="h200"), "smollm2", 3, "cuda")
    assert named.predict and named.bench.hardware == "h200"
    assert config_from_bench(BenchConfig(app="hover"), "smollm2", 3, device="cpu").predict


def test_a_tier_too_small_for_the_largest_request_is_refused(tiny) -> None:
    bench = BenchConfig(app="hover", workflows=1, gpu_kv_tokens=32)
    with pytest.raises(ValueError, match="raise --gpu-kv-tokens"):
        run_torch_bench(TorchBenchConfig(bench, model="tiny", predict=False), model=tiny)
