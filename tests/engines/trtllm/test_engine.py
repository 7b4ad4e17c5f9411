"""The adapter over the virtual-time SimLLM: perf metrics, retention bands, touches, gaps,
the event pump, the request classes, and cached tokens (each rule naming its upstream file)."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager

import numpy as np
import pytest
import trio

from pbkv.engines.base import GREEDY, EngineError, GenerateRequest, Sampling
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
from pbkv.engines.trtllm.api import Api, KvCacheRetentionConfig, SamplingParams
from pbkv.engines.trtllm.engine import optional_arguments

BS = 4
COST = CostModel(load_hardware("a6000-tp2"), load_model("qwen3-32b"))
AGENTS = ("coder", "filler")


def build(*, steer=True, gpu=64, host=64, ring=4096, llm_cls=None, engine_cls=None, **fake):
    config = BlockManagerConfig(
        BS, gpu_blocks=gpu, host_blocks=host, event_buffer_max_size=ring, **fake
    )
    manager = FakeBlockManager(config, trio.current_time)
    llm = (llm_cls or SimLLM)(manager, COST, SimLLMConfig(max_batch_size=8))
    kv = MirrorKV("pbkv" if steer else "lru", tokens_per_block=BS)
    engine = (engine_cls or TrtllmEngine)(
        llm, kv, TrtllmEngineConfig(tokens_per_block=BS, max_batch_size=8)
    )
    return manager, kv, engine


@asynccontextmanager
async def running(engine: TrtllmEngine):
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield
        nursery.cancel_scope.cancel()


_ids = iter(range(1 << 30))


def request(
    tokens, *, workflow=None, agent="coder", new=1, fixed=0, salt="", sampling=GREEDY
) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"r{next(_ids)}",
        workflow_id=workflow,
        agent=agent,
        prompt_token_ids=tuple(tokens),
        max_new_tokens=new,
        fixed_prefix_tokens=fixed,
        namespace=salt,
        sampling=sampling,
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


# -- the event pump (tensorrt_llm/executor/executor.py, result.py) ----------------------


class Spinning(AssertionError):
    """The pump polled over and over without virtual time passing."""


class TracedLLM(SimLLM):
    """SimLLM recording when each event is flushed and each poll happens."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.polls: list[float] = []
        self.flushed_s: dict[int, float] = {}
        drain = self.manager.get_latest_events

        def traced_drain():
            events = drain()
            for e in events:
                self.flushed_s[e["event_id"]] = trio.current_time()
            return events

        self.manager.get_latest_events = traced_drain

    def get_kv_cache_events(self, timeout=2):
        now = trio.current_time()
        self.polls.append(now)
        if len(self.polls) > 100 and self.polls[-100] == now:
            raise Spinning(f"100 polls at t={now}")
        return super().get_kv_cache_events(timeout)


class SpinningPump(TrtllmEngine):
    """Polls the sync API in a loop with a bare checkpoint (the latch is never lifted)."""

    async def _pump(self):
        await self._first_submit.wait()
        while True:
            events = self.llm.get_kv_cache_events(timeout=0)
            if events:
                self._apply_events(events)
            await trio.lowlevel.checkpoint()


class StarvingPump(TrtllmEngine):
    """Reads as ``get_kv_cache_events(timeout=2)`` does: until 2 s pass with no event."""

    async def _pump(self):
        await self._first_submit.wait()
        while True:
            events = [e async for e in self.llm.get_kv_cache_events_async(timeout=2)]
            self.llm._executor._iter_kv_events_result.mark_undone()  # not even spinning
            if events:
                self._apply_events(events)
            await trio.sleep(0.02)


async def check_pump(engine_cls) -> None:
    """Under steady load each event reaches the mirror within the longest poll pause (plus
    one step), and an idle engine is not polled at all."""
    _, kv, engine = build(steer=False, gpu=256, llm_cls=TracedLLM, engine_cls=engine_cls)
    llm = engine.llm
    applied_s: dict[int, float] = {}
    apply = kv.mirror.apply

    def traced_apply(event):
        applied_s[event["event_id"]] = trio.current_time()
        apply(event)

    kv.mirror.apply = traced_apply
    async with running(engine):
        await trio.sleep(5)  # before the first request: nothing to poll (upstream asserts)
        assert llm.polls == []
        async with trio.open_nursery() as nursery:
            for k in range(40):  # a request every 0.1 s for 4 s: events all the time
                nursery.start_soon(engine.generate, request(range(1000 * k, 1000 * k + 30), new=20))
                await trio.sleep(0.1)
        idle_from = trio.current_time() + engine.config.event_quiet_s + 0.1
        await trio.sleep(30)
    lags = [applied_s[i] - t for i, t in llm.flushed_s.items() if i in applied_s]
    assert len(lags) == len(llm.flushed_s) > 40
    assert max(lags) <= engine.config.event_poll_max_s + 0.001, f"starving: lag {max(lags):.2f} s"
    assert [t for t in llm.polls if t > idle_from] == [], "polling an idle engine"


async def test_the_pump_starts_after_the_first_request_and_neither_spins_nor_starves(
    autojump_clock,
):
    """executor.py::get_kv_events asserts before the first generate_async;
    result.py::IterationResult.get_results blocks until a quiet timeout, then latches."""
    await check_pump(TrtllmEngine)


def leaves(exc: BaseException) -> list[BaseException]:
    inner = getattr(exc, "exceptions", None)
    return [e for x in inner for e in leaves(x)] if inner else [exc]


async def test_the_pump_check_fails_on_a_spinning_pump(autojump_clock):
    with pytest.raises(BaseException) as failed:  # noqa: B017 - spinning fails the nursery
        await check_pump(SpinningPump)
    assert any(isinstance(e, Spinning) for e in leaves(failed.value))


async def test_the_pump_check_fails_on_a_starving_pump(autojump_clock):
    with pytest.raises(AssertionError, match="starving"):
        await check_pump(StarvingPump)


async def test_events_quiet_returns_once_the_mirror_has_everything(autojump_clock):
    manager, kv, engine = build(steer=False)
    prompt = list(range(100, 113))
    async with running(engine):
        await engine.generate(request(prompt))
        await engine.events_quiet()
        assert set(prompt_block_hashes(prompt, BS)) <= set(kv.mirror.blocks)
        assert engine.statistics().event_parks == 1


# -- requests (tensorrt_llm/llmapi/llm.py, sampling_params.py, executor/result.py) ------


class Recorder:
    """Request classes that record what the adapter built."""

    def __init__(self):
        self.params = []

    def SamplingParams(self, **kwargs):  # noqa: N802 - the upstream class's name
        self.params.append(kwargs)
        return SamplingParams(**kwargs)


async def test_sampling_params_come_from_the_engines_api_with_the_requests_sampling(
    autojump_clock,
):
    """sampling_params.py: keyword-only; greedy as top_k=1; temperature/top_p/seed."""
    _, _, engine = build(steer=False)
    recorder = Recorder()
    engine.api = Api(recorder.SamplingParams, KvCacheRetentionConfig, real=False)
    async with running(engine):
        await engine.generate(request(range(10)))
        await engine.generate(request(range(10), sampling=Sampling(0.7, 0.9, seed=-1)))
    assert recorder.params == [
        {"max_tokens": 1, "return_perf_metrics": True, "top_k": 1},
        {
            "max_tokens": 1,
            "return_perf_metrics": True,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 2**64 - 1,
        },
    ]


async def test_a_type_error_from_generate_async_fails_the_request_as_an_engine_error(
    autojump_clock,
):
    """llm.py::_prepare_sampling_params raises TypeError for a foreign SamplingParams."""
    _, _, engine = build(steer=False)

    def refuse(*args, **kwargs):
        raise TypeError("The sampling_params must be type SamplingParams or None")

    engine.llm.generate_async = refuse
    async with running(engine):
        with pytest.raises(EngineError, match="TypeError"):
            await engine.generate(request(range(10)))


def test_threaded_llm_brings_the_real_request_classes(monkeypatch):
    """A ``ThreadedLLM`` hands the adapter ``tensorrt_llm``'s own classes."""
    import types

    from pbkv.engines.trtllm.real import ThreadedLLM

    class RealSamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class RealRetention:
        pass

    monkeypatch.setitem(
        sys.modules, "tensorrt_llm", types.SimpleNamespace(SamplingParams=RealSamplingParams)
    )
    monkeypatch.setitem(
        sys.modules,
        "tensorrt_llm.llmapi",
        types.SimpleNamespace(KvCacheRetentionConfig=RealRetention),
    )

    class LLM:
        def generate_async(self, inputs, sampling_params=None, cache_salt=None): ...

    engine = TrtllmEngine(ThreadedLLM(LLM()), MirrorKV("lru", tokens_per_block=32))
    assert engine.api.SamplingParams is RealSamplingParams and engine.api.real
    assert engine.optional == {"cache_salt"}


@pytest.mark.parametrize("kv_config", [{"event_buffer_max_size": 0}, {"enable_block_reuse": False}])
def test_an_llm_without_kv_events_is_refused_with_the_setting_to_change(kv_config):
    """Upstream's default ring is 0 (no events): the mirror would stay empty, so the
    wrapper refuses it and names KvCacheConfig's fields."""
    import types

    from pbkv.engines.trtllm.real import ThreadedLLM

    config = {"event_buffer_max_size": 1024, "enable_block_reuse": True} | kv_config
    llm = types.SimpleNamespace(
        args=types.SimpleNamespace(kv_cache_config=types.SimpleNamespace(**config)),
        generate_async=lambda inputs, sampling_params=None: None,
    )
    with pytest.raises(ValueError, match="event_buffer_max_size"):
        ThreadedLLM(llm, api=object())


async def test_cached_tokens_count_a_partially_reused_block_by_its_matched_tokens(
    autojump_clock,
):
    """kvCacheManager.cpp::loadOrAllocateBlocks counts a partial match as a reused block;
    result.py's cached_tokens counts its matched tokens only."""
    _, kv, engine = build(steer=False)
    a = list(range(100, 113))  # 12 usable tokens: 3 full blocks
    b = a[:10] + [999, 998, 997]  # block 3 shares 2 of its 4 tokens
    async with running(engine):
        await engine.generate(request(a))
        again = await engine.generate(request(b))
    assert (again.cached_gpu_tokens, again.computed_tokens) == (10, 3)


class WithoutCachedTokens(SimLLM):
    """An engine whose outputs lack ``cached_tokens`` (older bindings): blocks only."""

    def generate_async(self, *args, **kwargs):
        out = super().generate_async(*args, **kwargs)

        class Output:
            async def aresult(self):
                await out.aresult()
                return self

            outputs = property(lambda self: out.outputs)

        return Output()


async def test_without_cached_tokens_a_maybe_partial_last_block_is_not_counted(autojump_clock):
    _, _, engine = build(steer=False, llm_cls=WithoutCachedTokens)
    a = list(range(100, 113))
    async with running(engine):
        await engine.generate(request(a))
        again = await engine.generate(request(a[:10] + [999, 998, 997]))
        same = await engine.generate(request(a))
    assert again.cached_gpu_tokens == 8  # 3 blocks reused, the third a partial match
    assert same.cached_gpu_tokens == 12  # the mirror holds block 3 whole


async def test_reused_blocks_are_divided_by_the_attention_windows(autojump_clock):
    """kvCacheManager.cpp: per-request counters are summed over window managers."""
    _, kv, engine = build(
        steer=False, llm_cls=WithoutCachedTokens, window_size=64, extra_window_sizes=(16,)
    )
    prompt = list(range(100, 113))
    async with running(engine):
        await engine.generate(request(prompt))
        await trio.sleep(1)
        again = await engine.generate(request(prompt))
    assert again.cached_gpu_tokens == 12
    stats = kv.mirror.statistics()
    assert stats.windows == 2 and stats.other_window_events > 0


async def test_a_salted_prompts_blocks_get_their_accessors(autojump_clock):
    """kvCacheManager.cpp::BlockKeyHasher::hash mixes the salt into the first block: the
    hashes the adapter expects are the ones the events carry."""
    _, kv, engine = build()
    prompt = list(range(100, 113))
    async with running(engine):
        kv.on_workflow_started("w")
        await engine.generate(request(prompt, workflow="w", salt="tenant"))
        await trio.sleep(1)
    hashes = prompt_block_hashes(prompt, BS, "tenant")
    assert hashes != prompt_block_hashes(prompt, BS)
    assert [kv.mirror.blocks[h].accessors for h in hashes] == [{"w": {"coder"}}] * 3
    assert {kv.mirror.blocks[h].salt for h in hashes} == {"tenant"}
    assert kv._expected == {}


async def test_a_serializer_that_fails_on_none_costs_a_gap_not_the_results(autojump_clock):
    """_utils.py (late 2025): _event_diff_to_json(None) raises, so an iteration holding a
    priority-only ``updated`` event is lost; the mirror sees a gap and resynchronises."""
    config = BlockManagerConfig(BS, gpu_blocks=64, host_blocks=64, event_buffer_max_size=4096)
    manager = FakeBlockManager(config, trio.current_time)
    llm = SimLLM(manager, COST, SimLLMConfig(max_batch_size=8, serializer_guards_none=False))
    kv = MirrorKV("pbkv", tokens_per_block=BS)
    engine = TrtllmEngine(llm, kv, TrtllmEngineConfig(tokens_per_block=BS, max_batch_size=8))
    prompt = list(range(100, 113))
    async with running(engine):
        kv.on_workflow_started("w")
        await engine.generate(request(prompt, workflow="w"))
        kv.on_workflow_terminated("w")  # a demotion touch re-tags: priority-only events
        await trio.sleep(5)
        kv.on_workflow_started("x")
        await engine.generate(request(range(500, 513), workflow="x"))  # new blocks only
        await trio.sleep(1)
        again = await engine.generate(request(prompt, workflow="x"))
    assert llm.events_lost > 0 and kv.mirror.statistics().gaps >= 1
    assert again.cached_gpu_tokens == 12
