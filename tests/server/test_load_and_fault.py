"""scripts/load_and_fault.py, short form: real ``pbkv serve`` processes on 127.0.0.1 under
load, the issue-27 triggers, a SIGTERM with workflows open, a double SIGINT and a fault in
one call: nothing lost, crashed, hung or leaked across tenants."""

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "load_and_fault.py"


def test_the_short_run_loses_crashes_hangs_and_leaks_nothing(tmp_path):
    spec = importlib.util.spec_from_file_location("load_and_fault", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # its dataclasses look their module up
    spec.loader.exec_module(script)
    out = tmp_path / "report.json"
    status = script.main(["--json", str(out)])
    report = json.loads(out.read_text())
    total = report["total"]
    assert (total["lost"], total["hangs"], total["crashes"], total["cross_tenant_leaks"]) == (
        0,
        0,
        0,
        0,
    ), total
    assert total["unexpected"] == []
    assert status == 0
    assert set(total["by_protocol"]) == {"HTTP/1.1", "HTTP/2"}
    assert total["refused"] >= 20  # the triggers were answered with errors, not dropped
    phases = report["phases"]
    assert phases["fault"]["completed"] == 21  # the 20 others and a /health after
    assert phases["double_sigint"]["notes"]["answered_shutting_down"] == 8
    sigterm = phases["sigterm"]["notes"]
    assert sigterm["exit_after_sigterm_s"] <= sigterm["graceful_timeout_s"]
