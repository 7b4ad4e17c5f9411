"""The adapter over the virtual-time SimLLM: perf metrics, retention bands, touches, gaps."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager

import numpy as np
import trio

from pbkv.engines.base import GenerateRequest
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.profile import load_hardware, load_model
from pbkv.engines.trtllm import (
    BlockManagerConfig,
    FakeBlockManager,
    MirrorKV,
    SimLLM,
    SimLLMConfig,
    TrtllmEngine,
    TrtllmEngineConfig,
    prompt_block_hashes,
)
from pbkv.engines.trtllm.engine import optional_arguments

BS = 4
COST = CostModel(load_hardware("a6000-tp2"), load_model("qwen3-32b"))
AGENTS = ("coder", "filler")


def build(*, steer=True, gpu=64, host=64, ring=4096):
    config = BlockManagerConfig(BS, gpu_blocks=gpu, host_blocks=host, event_buffer_max_size=ring)
    manager = FakeBlockManager(config, trio.current_time)
    llm = SimLLM(manager, COST, SimLLMConfig(max_batch_size=8))
    kv = MirrorKV("pbkv" if steer else "lru", tokens_per_block=BS)
    engine = TrtllmEngine(llm, kv, TrtllmEngineConfig(tokens_per_block=BS, max_batch_size=8))
    return manager, kv, engine


@asynccontextmanager
async def running(engine: TrtllmEngine):
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield
        nursery.cancel_scope.cancel()


_ids = iter(range(1 << 30))


def request(tokens, *, workflow=None, agent="coder", new=1, fixed=0) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"r{next(_ids)}",
        workflow_id=workflow,
        agent=agent,
        prompt_token_ids=tuple(tokens),
        max_new_tokens=new,
        fixed_prefix_tokens=fixed,
    )


def test_optional_arguments_come_from_the_signature():
    class Bare:
        def generate_async(self, inputs, sampling_params=None): ...

    class Salted:
        def generate_async(self, inputs, sampling_params=None, cache_salt=None): ...

    class Open:
        def generate_async(self, inputs, sampling_params=None, **kwargs): ...

    assert optional_arguments(Bare().generate_async) == frozenset()
    assert optional_arguments(Salted().generate_async) == {"cache_salt"}
    assert optional_arguments(Open().generate_async) == {"kv_cache_retention_config", "cache_salt"}
    assert "scripted_output_token_ids" in build()[2].optional


def test_importing_the_adapter_does_not_import_tensorrt_llm():
    assert "tensorrt_llm" not in sys.modules


async def test_a_repeated_prompt_reports_cached_tokens_from_perf_metrics(autojump_clock):
    _, _, engine = build(steer=False)
    prompt = list(range(100, 113))
    async with running(engine):
        first = await engine.generate(request(prompt))
        second = await engine.generate(request(prompt))
    assert (first.cached_gpu_tokens, first.computed_tokens) == (0, 13)
    assert (second.cached_gpu_tokens, second.computed_tokens) == (12, 1)  # 3 reused blocks
    assert engine.statistics().retention_configs == 0


async def test_steered_requests_tag_the_fixed_prefix_high_and_the_rest_by_score(autojump_clock):
    manager, kv, engine = build()
    prompt = list(range(100, 113))
    hashes = prompt_block_hashes(prompt, BS)
    async with running(engine):
        kv.on_workflow_started("w")
        await engine.generate(request(prompt, workflow="w", fixed=8))
        await trio.sleep(1)
    assert [manager.lookup(h).priority for h in hashes] == [95, 95, 50]
    assert [kv.mirror.blocks[h].priority for h in hashes] == [95, 95, 50]  # seen via events
    assert kv.mirror.blocks[hashes[2]].accessors == {"w": {"coder"}}


async def test_a_retired_workflow_is_re_tagged_below_30_by_a_touch(autojump_clock):
    manager, kv, engine = build()
    prompt = list(range(100, 113))
    hashes = prompt_block_hashes(prompt, BS)
    async with running(engine):
        kv.on_workflow_started("w")
        await engine.generate(request(prompt, workflow="w"))
        await trio.sleep(1)
        assert [manager.lookup(h).priority for h in hashes] == [50, 50, 50]
        kv.on_workflow_terminated("w")
        await trio.sleep(5)
    assert [manager.lookup(h).priority for h in hashes] == [10, 10, 10]
    assert [kv.mirror.blocks[h].priority for h in hashes] == [10, 10, 10]
    stats = engine.statistics()
    assert (stats.touches_demote, stats.touch_blocks_retagged) == (1, 3)


async def test_a_touch_request_onboards_a_host_prefix_before_its_agent_runs(autojump_clock):
    manager, kv, engine = build(gpu=10, host=32)
    a = list(range(100, 113))  # 3 reusable blocks
    ha = prompt_block_hashes(a, BS)
    async with running(engine):
        for w in ("w", "f"):
            kv.on_workflow_started(w)
        kv.on_forecast("f", np.array([[0.0, 0.0, 1.0]]), AGENTS)  # f's cache is dead
        await engine.generate(request(a, workflow="w"))
        await engine.generate(request(range(500, 537), workflow="f", agent="filler", new=3))
        await trio.sleep(1)
        assert [kv.mirror.blocks[h].level for h in ha] == [1, 1, 1]  # offloaded by f
        onboarded = manager.counters.onboarded_blocks
        kv.on_forecast("w", np.array([[0.9, 0.0, 0.1]]), AGENTS)  # coder runs next
        await trio.sleep(5)
    assert [kv.mirror.blocks[h].level for h in ha] == [0, 0, 0]
    assert manager.counters.onboarded_blocks - onboarded == 3
    stats = engine.statistics()
    assert (stats.touches_prefetch, stats.touch_blocks_onboarded) == (1, 3)


async def test_an_overflowing_event_ring_is_detected_and_results_stay_right(autojump_clock):
    _, kv, engine = build(ring=2)
    prompt = list(range(100, 113))
    async with running(engine):
        kv.on_workflow_started("w")
        for base in range(200, 1000, 100):  # many events between two pumps
            async with trio.open_nursery() as nursery:
                for k in range(4):
                    nursery.start_soon(
                        engine.generate, request(range(base + k * 20, base + k * 20 + 13))
                    )
        again = [await engine.generate(request(prompt, workflow="w")) for _ in range(2)][1]
    mirror = engine.statistics().mirror
    assert mirror.gaps >= 1 and mirror.lost_events >= 1
    assert again.cached_gpu_tokens == 12  # from perf metrics, not from the mirror


def test_the_rest_of_pbkv_does_not_import_the_adapter():
    import subprocess

    code = (
        "import sys, pbkv.cli, pbkv.bench.compare, pbkv.bench.trtllm, pbkv.engines.sim.engine, "
        "pbkv.actors.serve; print('pbkv.engines.trtllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
