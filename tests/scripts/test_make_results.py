"""docs/results.md is generated from the study's JSON, with the reproducing commands."""

import runpy
import shlex
import shutil
import sys
from pathlib import Path

from pbkv.cli import main

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_results.py"


def test_results_page_is_generated_from_json(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    args = shlex.split(
        "--app codegen --workflows 4 --concurrency 2 --train-workflows 20 "
        "--policies lru,kvflow,lae,he,pbkv,belady-est"
    )
    assert main(["bench", *args, "--json", str(data / "bench-hover.json")]) == 0
    shutil.copy(data / "bench-hover.json", data / "bench-financebench.json")
    out = tmp_path / "results.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(data), str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    text = out.read_text()
    assert "Ablation ladder on hover" in text and "paper lru 27.1%" in text
    assert "against the infinite-cache ceiling" in text and "against offline MIN" in text
    assert "pbkv vs kvflow" in text
    assert "`pbkv bench --app codegen" in text
    assert text.count("| belady-est | fcfs |") == 2
    assert text.count("| ceiling (infinite cache) |") == 2


def test_predictor_section_comes_from_eval_and_bench_json(tmp_path, monkeypatch):
    monkeypatch.setenv("PBKV_CACHE_DIR", str(tmp_path / "cache"))
    data, traces = tmp_path / "data", tmp_path / "t.jsonl"
    assert main(f"trace generate --app codegen --workflows 12 --seed 0 --out {traces}".split()) == 0
    cv = f"eval-predictor --app codegen --traces {traces} --folds 3 --predictors markov-1,oracle"
    assert main([*cv.split(), "--json", str(data / "predictor-codegen-cv.json")]) == 0
    ckpt = tmp_path / "ckpt"
    train = f"train --app codegen --traces {traces} --out {ckpt} --epochs 1 --text-encoder none"
    assert main(train.split()) == 0
    bench = f"bench-predictor --checkpoint {ckpt} --batch 8 --repeats 2"
    assert main([*bench.split(), "--json", str(data / "predictor-latency.json")]) == 0
    out = tmp_path / "results.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(data), str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    text = out.read_text()
    assert "3-fold cross-validation by task over 12 traces" in text
    assert "| oracle | 1.000 | 1.000 | 1.000 |" in text
    assert "`pbkv eval-predictor --app codegen" in text
    assert "for a batch of 8 states on 1 CPU thread(s)" in text
    assert "for 12 traces, 1 member(s) x 1 epochs" in text


def test_paper_load_rows_keep_lru_and_lru_workflow_apart(tmp_path, monkeypatch):
    """Two rows of one policy under different schedulers are both reported, and the
    tables' ratios are taken against plain lru (fcfs), not the last lru row."""
    data = tmp_path / "data"
    data.mkdir()
    args = "bench --app codegen --workflows 4 --concurrency 2 --policies lru,lru:workflow,pbkv"
    assert main([*args.split(), "--json", str(data / "bench-codegen-c2.json")]) == 0
    out = tmp_path / "results.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(data), str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    lines = out.read_text().splitlines()
    line = next(x for x in lines if x.startswith("- **codegen, 4 workflows, c=2"))
    assert "x lru;" in line and "x lru:workflow;" in line
    assert "total hit lru " in line and ", lru:workflow " in line and "MIN " in line
    lru_row = next(x for x in lines if x.startswith("| lru | fcfs |"))
    assert "| 1.000x | 1.000x | 1.000x | 1.000x |" in lru_row  # plain lru against itself
