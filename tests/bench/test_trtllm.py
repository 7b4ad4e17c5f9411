"""``pbkv bench --engine trtllm-sim``: three rows on one workload, through the CLI too."""

from __future__ import annotations

import sys

from pbkv.bench.compare import BenchConfig
from pbkv.bench.trtllm import TRTLLM_MODES, compare_trtllm, steering_summary
from pbkv.cli import main

SMALL = dict(app="codegen", workflows=6, concurrency=3, train_workflows=30, seed=1)


def test_the_three_modes_serve_the_same_workload():
    results, gpu_tokens, runs = compare_trtllm(BenchConfig(**SMALL))
    assert tuple(r.policy for r in results) == TRTLLM_MODES
    assert len({r.kv.prompt_tokens for r in results}) == 1  # same prompts, touches excluded
    assert all(r.failed_workflows == 0 and r.workflows == 6 for r in results)
    default, steered = (run.adapter for run in runs)
    assert default.retention_configs == 0 and steered.retention_configs >= steered.requests
    assert default.mirror.gaps == steered.mirror.gaps == 0
    assert gpu_tokens > 0
    lines = steering_summary(results, runs)
    assert lines[0].startswith("gain of steering over trtllm default")
    assert "tensorrt_llm" not in sys.modules


def test_cli_prints_the_comparison(capsys):
    argv = ["bench", "--engine", "trtllm-sim"]
    for k, v in SMALL.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for mode in TRTLLM_MODES:
        assert mode in out
    assert "steering loss vs pbkv owning the cache" in out
