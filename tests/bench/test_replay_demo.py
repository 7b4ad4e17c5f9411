"""The replayed-workload comparison on the torch engine (pbkv/bench/replay_demo.py)."""

from __future__ import annotations

import pytest
import torch

from pbkv.bench.replay_demo import DemoConfig, WorkloadShrink, run_demo, shrink_workflow
from pbkv.engines.torchengine import load_model


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return load_model("tiny", device="cpu")


def test_shrink_keeps_every_prefix_relation_between_prompts() -> None:
    from pbkv.examples import get_app

    spec = WorkloadShrink(
        preamble_tokens=50, role_tokens=12, head_tokens=8, tail_tokens=3, max_steps=6
    )
    for app in ("codegen", "taubench"):
        for wf in get_app(app).generate(3, seed=1):
            small = shrink_workflow(wf, spec)
            assert len(small.steps) == min(6, len(wf.steps))
            pairs = list(zip(wf.steps, small.steps, strict=False))
            for i, (a, sa) in enumerate(pairs):
                assert sa.output_tokens <= spec.output_tokens
                assert len(sa.segments[0].token_ids) <= 50 and len(sa.segments[1].token_ids) <= 12
                for b, sb in pairs[i + 1 :]:
                    full = b.prompt_token_ids[: a.prompt_tokens] == a.prompt_token_ids
                    cut = sb.prompt_token_ids[: sa.prompt_tokens] == sa.prompt_token_ids
                    assert full == cut


def test_demo_compares_policies_on_the_tiny_model(tiny: torch.nn.Module) -> None:
    spec = WorkloadShrink(max_steps=4, output_tokens=3, gap_scale=0.0)
    config = DemoConfig(
        model="tiny", apps=("codegen", "taubench"), workflows=2, concurrency=2, shrink=spec
    )
    apps = run_demo(config, model=tiny)
    assert [a.app for a in apps] == ["codegen", "taubench"]
    for a in apps:
        assert [r.policy for r in a.results] == ["lru", "pbkv"]
        assert [r.predictor for r in a.results] == ["-", "markov"]
        for r in a.results:
            assert r.workflows == 2 and r.kv.requests == a.invocations
            assert (
                r.kv.prompt_tokens
                == r.kv.cached_gpu_tokens + r.kv.cached_host_tokens + r.recomputed_tokens
            )
            assert 0 < r.gpu_hit_rate < 1 and r.mean_latency_s > 0 and r.mean_ttft_s > 0
        assert a.gpu_kv_tokens % 16 == 0 and a.host_kv_tokens == (a.gpu_kv_tokens // 16 // 2) * 16
