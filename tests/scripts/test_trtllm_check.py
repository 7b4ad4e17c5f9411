"""scripts/trtllm_check.py: refuses to run without TensorRT-LLM, and sizes the engine
from the workload (``llm_args.py``: ``max_num_tokens`` defaults to 8,192, shorter than a
codegen prompt)."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "trtllm_check.py"


@pytest.fixture(scope="module")
def script():
    return runpy.run_path(str(SCRIPT))


def test_without_tensorrt_llm_it_says_why_and_exits_non_zero(capsys, tmp_path, script):
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed here: the script would really run")
    assert script["main"](["--out", str(tmp_path / "x.json")]) == 2
    assert "tensorrt_llm is not importable" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_engine_limits_fit_the_longest_codegen_prompt(script):
    args = script["parse"](["--model", "m"])
    limits = script["engine_limits"](script["workload"](args))
    assert limits["longest_prompt_tokens"] > 8192  # the engine's default would refuse it
    assert limits["max_num_tokens"] > limits["longest_prompt_tokens"]
    assert limits["max_num_tokens"] % 1024 == 0
    assert limits["max_seq_len"] > limits["longest_sequence_tokens"]


def test_each_part_gets_the_parents_arguments_but_its_own_report(script):
    argv = ["--model", "m", "--out", "a.json", "--quick", "--out=b.json"]
    assert script["_without_option"](argv, "--out") == ["--model", "m", "--quick"]
    args = script["parse"](["--quick"])
    assert (args.workflows, args.concurrency, args.partial_reuse) == (4, 4, False)
    assert script["PARTS"] == ("probe", "lru", "pbkv")  # a fresh process (and LLM) each
