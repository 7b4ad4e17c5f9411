"""``python -m pbkv.bench.micro`` runs and prints issue 13's three targets (no timings
are asserted: they belong to the machine, not to the code)."""

import json
import sys
from pathlib import Path

from pbkv.bench import micro

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("score refresh per touched node", "actor tell throughput", "GraphSAGE forecast")
TINY = micro.Sizes(
    tell_messages=300,
    tell_repeats=1,
    ask_messages=50,
    refresh_rounds=20,
    forecast_states=8,
    forecast_repeats=1,
    sim_workflows=2,
    sim_train_workflows=4,
)


def test_target_rows_print_value_target_reference_ratio_and_verdict(capsys, monkeypatch):
    monkeypatch.setattr(micro, "forecast_ms", lambda states, repeats: 25.0)  # runs below
    quick = micro.target_rows(TINY)[2]  # 8 states: no verdict against the 1,024-state target
    assert (quick.met, quick.ratio, quick.target) == (None, "-", "≤ 20 ms at 1,024 states")
    monkeypatch.setattr(micro, "FORECAST_STATES", TINY.forecast_states)
    rows = micro.target_rows(TINY)
    assert rows[2].value == "25.00 ms" and rows[2].met is False
    assert "ms matmul floor" in rows[2].reference  # the arithmetic floor, same run
    assert [r.measure.split(",")[0] for r in rows] == list(TARGETS)
    for row in rows:
        assert row.met in (True, False)
        assert row.ratio.endswith("x") and row.reference != "-"
    assert "raw trio channel" in rows[1].reference
    micro.Console(width=160).print(micro.render(rows, "t"))
    out = capsys.readouterr().out
    for name in TARGETS:
        assert name in out
    assert "reference (same run)" in out and "met?" in out


def test_the_command_runs_quick(capsys, monkeypatch):
    monkeypatch.setattr(micro, "QUICK", TINY)
    micro.main(["--quick"])
    out = capsys.readouterr().out
    for name in (*TARGETS, "actor ask round trip", "GPU eviction per node"):
        assert name in out
    forecast_line = next(line for line in out.splitlines() if "GraphSAGE forecast" in line)
    assert " ms " in forecast_line or "not run" in forecast_line  # timed, or says why not


def test_forecast_row_says_so_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    result = micro.forecast_ms(8, 1)
    assert isinstance(result, str) and result.startswith("not run: torch")
    assert micro.forecast_matmul_floor_ms(8, 1) == result
    rows = micro.target_rows(TINY)
    assert rows[2].value == result and rows[2].met is None


def test_the_matmul_floor_is_timed_on_the_model_shapes():
    assert micro.forecast_matmul_floor_ms(8, 1) > 0


def test_forecast_config_is_the_checkpoint_config_of_the_latency_study():
    document = json.loads((ROOT / "docs/data/predictor-latency.json").read_text())
    assert document["checkpoint"]["config"] == micro.FORECAST_CONFIG


def test_tell_and_channel_handle_every_message():
    assert micro.tell_throughput(200) > 0
    assert micro.channel_throughput(200) > 0
    comparison = micro.compare_tell(200, 1)
    assert comparison.ratio == comparison.tell_msgs_per_s / comparison.channel_msgs_per_s
