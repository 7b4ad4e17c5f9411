"""The predictor's CLI verbs end to end on a small codegen workload (no text model)."""

import json

import pytest
from rich.console import Console

from pbkv.predictor import read_traces
from pbkv.predictor_commands import (
    bench_predictor,
    eval_predictor,
    trace_generate,
    trace_split,
    train,
)


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_generate_train_evaluate_and_time(tmp_path, monkeypatch):
    traces = tmp_path / "codegen.jsonl"
    out = render(trace_generate("codegen", 40, 7, traces))
    monkeypatch.setenv("PBKV_CACHE_DIR", str(tmp_path / "cache"))  # text vectors go here
    assert "codegen.jsonl" in out and len(read_traces(traces).records) == 40

    out = render(trace_split(traces, tmp_path / "a.jsonl", tmp_path / "b.jsonl", by_task=False))
    assert len(read_traces(tmp_path / "b.jsonl").records) == 10

    quiet = Console(file=open(tmp_path / "progress.txt", "w"))  # noqa: SIM115
    summary = render(
        train("codegen", traces, tmp_path / "ckpt", epochs=2, text_encoder="hashing", console=quiet)
    )
    assert "text encoder" in summary and "hashing" in summary
    sidecar = json.loads((tmp_path / "ckpt" / "graphsage.json").read_text())
    assert sidecar["agents"] == ["planner", "coder", "tester", "analyzer"]
    assert sidecar["horizon"] == 3 and sidecar["text_encoder"] == "hashing"
    assert sidecar["training"]["traces"] == 40

    table = render(
        eval_predictor(
            "codegen",
            tmp_path / "b.jsonl",
            ["markov-1", "graphsage", "graphsage-notext", "oracle"],
            checkpoint=tmp_path / "ckpt",
        )
    )
    rows = {line.split()[1]: line for line in table.splitlines() if line.startswith("│")}
    assert {"markov-1", "graphsage", "graphsage-notext", "oracle", "paper"} <= set(rows)
    assert "1.000 │     1.000 │     1.000" in rows["oracle"]

    timing = render(bench_predictor(tmp_path / "ckpt", batch=32, repeats=2, threads=1))
    assert "batch 32" in timing and "median cpu ms" in timing


def test_eval_names_what_is_missing(tmp_path):
    traces = tmp_path / "t.jsonl"
    trace_generate("codegen", 3, 0, traces)
    with pytest.raises(ValueError, match="'graphsage-notext' needs a checkpoint or training"):
        eval_predictor("codegen", traces, ["graphsage-notext"], text_encoder="hashing")
    with pytest.raises(ValueError, match="without a text encoder has none"):
        eval_predictor("codegen", traces, ["graphsage-notext"], train_traces=traces)
    with pytest.raises(ValueError, match="unknown predictor 'lstm'"):
        eval_predictor("codegen", traces, ["lstm"])
    with pytest.raises(ValueError, match="unknown text encoder 'bert'"):
        eval_predictor("codegen", traces, ["markov-1"], text_encoder="bert")
    with pytest.raises(ValueError, match="no predictors given"):
        eval_predictor("codegen", traces, [])
