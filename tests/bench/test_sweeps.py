"""Sweeps, plots and the sweep/trace-plot commands on tiny workloads."""

import json
import shlex

import pytest

from pbkv.bench.compare import BenchConfig
from pbkv.bench.sweeps import sweep
from pbkv.cli import main

TINY = BenchConfig(
    app="codegen", workflows=6, concurrency=2, train_workflows=20, policies=("lru", "pbkv")
)


def test_concurrency_sweep_keeps_gpu_tier_fixed_and_orders_points():
    points = sweep(TINY, "concurrency", [1, 3])
    assert [p.value for p in points] == [1.0, 3.0]
    assert points[0].gpu_kv_tokens == points[1].gpu_kv_tokens
    assert [r.policy for r in points[0].results] == ["lru", "pbkv"]
    for p in points:
        assert p.hit_rate_spread == pytest.approx(
            max(r.gpu_hit_rate for r in p.results) - min(r.gpu_hit_rate for r in p.results)
        )


def test_sweep_rejects_bad_values():
    with pytest.raises(ValueError, match="integers >= 1"):
        sweep(TINY, "horizon", [0])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        sweep(TINY, "noise", [1.5])
    with pytest.raises(ValueError, match="known: concurrency, horizon, noise"):
        sweep(TINY, "gamma", [0.5])  # type: ignore[arg-type]


def test_noise_never_changes_lru():
    points = sweep(TINY, "noise", [0.0, 1.0])
    lru = [p.results[0] for p in points]
    assert lru[0].gpu_hit_rate == lru[1].gpu_hit_rate  # lru never reads forecasts
    assert lru[0].kv == lru[1].kv


def test_sweep_and_trace_plot_commands_write_files(tmp_path, capsys):
    args = shlex.split(
        "--app codegen --workflows 4 --concurrency 2 --train-workflows 20 --policies lru,pbkv"
    )
    assert main(["sweep", "horizon", "--values", "1,2", "--out-dir", str(tmp_path), *args]) == 0
    payload = json.loads((tmp_path / "sweep-horizon-codegen.json").read_text())
    assert payload["parameter"] == "horizon" and len(payload["points"]) == 2
    assert payload["command"].startswith("pbkv ")
    assert (tmp_path / "sweep-horizon-codegen.png").stat().st_size > 10_000
    png = tmp_path / "timeline.png"
    assert main(["trace-plot", "--out", str(png), *args]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "spread pp" in capsys.readouterr().out
