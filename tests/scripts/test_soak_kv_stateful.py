"""scripts/soak_kv_stateful.py: a short soak runs the KV manager's machine and reports."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak_kv_stateful.py"


def test_a_short_soak_checks_the_steps_it_was_asked_for(tmp_path):
    spec = importlib.util.spec_from_file_location("soak_kv_stateful", SCRIPT)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    out = tmp_path / "soak.json"
    assert soak.main(["--steps", "300", "--chunk-examples", "5", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["steps"] >= 300 and figures["examples"] >= 5
    assert (figures["violations"], figures["violation_reports"]) == (0, [])
