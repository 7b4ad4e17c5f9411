"""`pbkv demo` runs the live app on a real model and prints the comparison and the paths."""

import json
import re

from pbkv.cli import main
from pbkv.predictor import make_forecaster
from pbkv.predictor.trace import read_traces


def test_demo_on_the_tiny_model_routes_on_real_test_runs(capsys, tmp_path):
    out_json, traces = tmp_path / "demo.json", tmp_path / "runs.jsonl"
    argv = [
        "demo",
        "--model",
        "tiny",
        "--workflows",
        "2",
        "--concurrency",
        "2",
        "--code-tokens",
        "16",
        "--context-tokens",
        "512",
        "--repeats",
        "1",
    ]
    code = main([*argv, "--json", str(out_json), "--traces", str(traces)])
    out = capsys.readouterr().out
    assert code == 0
    assert "live-codegen: 2 workflows" in out and "wall-clock seconds" in out
    rows = ("lru:fcfs", "lru:workflow", "pbkv:workflow")  # the defaults, scheduler named
    figures = r" +[\d.,]+ +[\d.,]+ "  # a row name, then two figures
    assert [len(re.findall(rf"^{p}{figures}", out, re.M)) for p in rows] == [1, 1, 1]
    assert "paths taken" in out

    demo = json.loads(out_json.read_text())
    assert [r["policy"] for r in demo["runs"]] == ["lru", "lru:workflow", "pbkv"]
    assert demo["tasks"] == ["add", "is_even"]
    for run in demo["runs"]:
        kv = run["result"]["kv"]
        assert kv["prompt_tokens"] == (
            kv["cached_gpu_tokens"] + kv["cached_host_tokens"] + kv["computed_tokens"]
        )
        assert run["result"]["wall_s"] > 0 and run["result"]["failed_workflows"] == 0
        for path in run["paths"]:
            # random weights write no working code: every real test run fails, the
            # Analyzer sends it back once, and the retry cap ends the workflow
            steps = path["steps"]
            assert steps[:2] == ["planner", "coder"] and steps[3:5] == ["analyzer", "coder"]
            assert steps[2] in ("ERROR", "FAIL") and steps[5] in ("ERROR", "FAIL")
            assert path["reason"] == "recursion_limit"
            assert all(r.split(":")[0] in ("ERROR", "FAIL") for r in path["reports"])

    records = read_traces(traces, strict=True).records
    assert len(records) == 6 and {r.app for r in records} == {"live-codegen"}
    assert all(r.agents == ("planner", "coder", "analyzer", "coder") for r in records)
    assert all(r.steps[2].gap_s > 0 for r in records)  # the real test run before the Analyzer
    markov = make_forecaster(
        "markov", agents=("planner", "coder", "analyzer"), horizon=2, traces=records
    )
    assert markov.name == "markov-1"


def test_demo_rejects_unknown_model(capsys):
    assert main(["demo", "--model", "no-such-model", "--workflows", "1"]) == 2
    assert "smollm2, tiny" in capsys.readouterr().err


def test_app_help_names_every_registered_app():
    from pbkv.cli.arguments import APP_HELP
    from pbkv.examples import app_names

    assert all(name in APP_HELP for name in app_names())
