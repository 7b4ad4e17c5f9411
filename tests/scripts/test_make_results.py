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
        "--policies lru,kvflow,lae,he,pbkv,belady"
    )
    assert main(["bench", *args, "--json", str(data / "bench-hover.json")]) == 0
    shutil.copy(data / "bench-hover.json", data / "bench-financebench.json")
    out = tmp_path / "results.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(data), str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    text = out.read_text()
    assert "Ablation ladder on hover" in text and "paper lru 27.1%" in text
    assert "of belady's GPU hit rate" in text
    assert "pbkv vs kvflow" in text
    assert "`pbkv bench --app codegen" in text
    assert text.count("| belady |") == 2
