"""scripts/trtllm_check.py refuses to run without TensorRT-LLM, saying why."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "trtllm_check.py"


def test_without_tensorrt_llm_it_says_why_and_exits_non_zero(capsys, tmp_path):
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed here: the script would really run")
    main = runpy.run_path(str(SCRIPT))["main"]
    assert main(["--out", str(tmp_path / "x.json")]) == 2
    assert "tensorrt_llm is not importable" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
