"""The open-loop summary of docs/results.md: runs sorted by app, gaps, load and seed, and
goodput shown where a run set an SLO."""

import runpy
import sys
from pathlib import Path

from pbkv.cli import main

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_results.py"


def _bench(data: Path, name: str, extra: str) -> None:
    args = (
        "bench --app codegen --workflows 6 --concurrency 3 --load 0.9 --gap-scale 10 "
        f"--policies lru:workflow,continuum,pbkv {extra} --json {data / name}"
    )
    assert main(args.split()) == 0


def test_open_loop_goodput_and_seeds(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    _bench(data, "open-codegen-load0.9-gap10.json", "--slo-s 1000")
    _bench(data, "open-codegen-load0.9-gap10-seed1.json", "--seed 1")
    out = tmp_path / "results.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(data), str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    lines = out.read_text().splitlines()
    summary = [x for x in lines if x.startswith("| codegen | 6 / 3 |")]
    assert [x.split(" | ")[2] for x in summary] == ["0", "1"]  # seed 0 first
    goodput = [x for x in lines if x.startswith("| codegen | 0 | 0.9 | x10 bundled | 1000 |")]
    assert len(goodput) == 1 and goodput[0].endswith("x |")
    assert not any(x.startswith("| codegen | 1 | 0.9 | x10 bundled |") for x in lines)
    assert any(x.startswith("## `open-codegen-load0.9-gap10`") and "SLO 1000 s" in x for x in lines)
    assert any("goodput wf/s (SLO 1000 s) |" in x for x in lines)
    assert any(x.startswith("- **Worst pbkv / lru:workflow in open loop**") for x in lines)
