"""The virtual-time engine: exact timings from the cost model, prefix hits, host reloads,
prefetch, batching, failures and determinism (§7.1)."""

import dataclasses
from contextlib import asynccontextmanager

import numpy as np
import pytest
import trio
import trio.testing

from pbkv.engines.base import EngineError, GenerateRequest, RequestTooLarge
from pbkv.engines.scheduler import WorkflowScheduler
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.engine import SimConfig, SimEngine
from pbkv.engines.sim.profile import load_hardware, load_model
from pbkv.kvmanager import KVConfig, KVManager
from pbkv.runtime import seed_scheduler

BS = 16
PROMPT = 500  # compute-bound on this testbed, so a prefix hit shortens the prefill
COST = CostModel(load_hardware("a6000-tp2"), load_model("qwen3-32b"))
BYTES_PER_BLOCK = COST.kv_bytes_per_token * BS


def make_engine(*, policy="lru", gpu_blocks=80, host_blocks=256, **sim) -> SimEngine:
    kv = KVManager(
        KVConfig(
            block_size=BS,
            gpu_capacity_blocks=gpu_blocks,
            host_capacity_blocks=host_blocks,
            bytes_per_block=BYTES_PER_BLOCK,
            policy=policy,
            bandwidth_bytes_per_s=COST.bandwidth_bytes_per_s,
        ),
        trio.current_time,
    )
    return SimEngine(kv, COST, SimConfig(check_integrity=True, **sim))


@asynccontextmanager
async def running(engine: SimEngine):
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield engine
        nursery.cancel_scope.cancel()


def prompt(base: int, n: int = PROMPT) -> tuple[int, ...]:
    return tuple(range(base, base + n))


def request(rid, tokens, max_new_tokens=5, workflow=None, agent="") -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        workflow_id=workflow,
        agent=agent,
        prompt_token_ids=tokens,
        max_new_tokens=max_new_tokens,
        scripted_output_token_ids=(7, 8),
    )


def decode_s(prompt_tokens: int, max_new_tokens: int) -> float:
    """Decode steps after the first token: the context grows by one token each step."""
    return sum(COST.decode_step_s(1, prompt_tokens + g) for g in range(1, max_new_tokens))


def assert_no_leases(engine: SimEngine) -> None:
    engine.kv.check_integrity()
    assert engine.kv.tree.private_blocks("gpu") == 0
    assert all(n.lock_count == 0 for n in engine.kv.tree.nodes())


async def test_one_request_costs_one_prefill_then_decode_steps(autojump_clock):
    engine = make_engine()
    async with running(engine):
        t0 = trio.current_time()
        r = await engine.generate(request("a", prompt(0, 100), max_new_tokens=5))
        assert trio.current_time() - t0 == pytest.approx(r.e2e_s, rel=1e-12)
    assert r.output_token_ids == (7, 8, 0, 0, 0)
    assert (r.prompt_tokens, r.cached_gpu_tokens, r.cached_host_tokens, r.computed_tokens) == (
        100,
        0,
        0,
        100,
    )
    assert r.queue_s == 0.0
    assert r.ttft_s == pytest.approx(COST.prefill_s(100, 0), rel=1e-12)
    assert r.e2e_s == pytest.approx(r.ttft_s + decode_s(100, 5), rel=1e-12)
    stats = engine.statistics()
    assert (stats.steps, stats.prefill_tokens, stats.decode_tokens) == (5, 100, 4)
    assert stats.busy_s == pytest.approx(r.e2e_s, rel=1e-12)
    assert_no_leases(engine)


async def test_chunked_prefill_splits_the_prompt_over_steps(autojump_clock):
    engine = make_engine(max_prefill_tokens=256)
    async with running(engine):
        r = await engine.generate(request("a", prompt(0), max_new_tokens=1))
    expected = COST.prefill_s(256, 0) + COST.prefill_s(PROMPT - 256, 256)
    assert r.ttft_s == pytest.approx(expected, rel=1e-12)
    assert r.e2e_s == r.ttft_s  # one output token: done at the first token
    assert engine.statistics().steps == 2


async def test_identical_request_hits_the_gpu_prefix(autojump_clock):
    engine = make_engine()
    async with running(engine):
        first = await engine.generate(request("a", prompt(0)))
        second = await engine.generate(request("b", prompt(0)))
    hit = PROMPT // BS * BS  # 496: the partial tail block is never cached
    assert (first.cached_gpu_tokens, first.computed_tokens) == (0, PROMPT)
    assert (second.cached_gpu_tokens, second.cached_host_tokens) == (hit, 0)
    assert second.computed_tokens == PROMPT - hit
    assert second.ttft_s == pytest.approx(COST.prefill_s(PROMPT - hit, hit), rel=1e-12)
    assert second.ttft_s < first.ttft_s / 3
    assert second.e2e_s == pytest.approx(second.ttft_s + decode_s(PROMPT, 5), rel=1e-12)
    kv = engine.kv.statistics()
    assert (kv.requests, kv.prompt_tokens, kv.cached_gpu_tokens) == (2, 2 * PROMPT, hit)
    assert_no_leases(engine)


async def test_host_hit_reloads_and_pays_the_transfer(autojump_clock):
    engine = make_engine(gpu_blocks=80)
    async with running(engine):
        await engine.generate(request("a", prompt(0)))  # 31 blocks cached (32 at peak)
        await engine.generate(request("b", prompt(10_000)))
        await engine.generate(request("c", prompt(20_000)))  # LRU demotes a's last 14 blocks
        again = await engine.generate(request("a2", prompt(0)))
    assert (again.cached_gpu_tokens, again.cached_host_tokens) == (17 * BS, 14 * BS)
    assert again.computed_tokens == PROMPT - 31 * BS
    transfer_s = COST.transfer_s(14 * BYTES_PER_BLOCK)
    assert transfer_s > 0
    expected = transfer_s + COST.prefill_s(PROMPT - 31 * BS, 31 * BS)
    assert again.ttft_s == pytest.approx(expected, rel=1e-12)
    kv = engine.kv.statistics()
    assert kv.h2d_bytes == 14 * BYTES_PER_BLOCK
    assert kv.demoted_blocks == 28  # a's tail, then b's tail to make room for the reload
    stats = engine.statistics()
    assert stats.link_busy_s == pytest.approx(transfer_s, rel=1e-12)
    assert_no_leases(engine)


async def test_request_larger_than_the_gpu_fails_and_the_engine_goes_on(autojump_clock):
    engine = make_engine(gpu_blocks=8)
    async with running(engine):
        with pytest.raises(EngineError, match="needs 32 GPU blocks; the tier holds 8"):
            await engine.generate(request("big", prompt(0)))
        ok = await engine.generate(request("small", prompt(0, 50)))
    assert ok.computed_tokens == 50
    assert_no_leases(engine)


async def test_malformed_requests_are_refused(autojump_clock):
    engine = make_engine()
    async with running(engine):
        with pytest.raises(ValueError, match="empty prompt"):
            await engine.generate(request("e", ()))
        with pytest.raises(ValueError, match="max_new_tokens"):
            await engine.generate(request("z", prompt(0, 10), max_new_tokens=0))


async def test_concurrent_requests_share_steps(autojump_clock):
    solo = COST.prefill_s(PROMPT, 0) + decode_s(PROMPT, 10)
    engine = make_engine()
    results = {}

    async def submit(rid, base):
        results[rid] = await engine.generate(request(rid, prompt(base), max_new_tokens=10))

    async with running(engine):
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit, "a", 0)
            nursery.start_soon(submit, "b", 10_000)
        total_s = trio.current_time() - t0
    a, b = results["a"], results["b"]
    both = COST.step_s([(PROMPT, 0), (PROMPT, 0)], 0, 0)
    assert a.ttft_s == b.ttft_s == pytest.approx(both, rel=1e-12)
    assert total_s == pytest.approx(a.e2e_s, rel=1e-12) and a.e2e_s == b.e2e_s
    assert total_s < 2 * solo
    assert engine.statistics().steps == 10  # one joint prefill step + nine joint decode steps
    assert_no_leases(engine)


async def test_queued_request_waits_for_gpu_room(autojump_clock):
    engine = make_engine(gpu_blocks=40, host_blocks=0)  # room for one 32-block request
    results = {}

    async def submit(rid, base):
        results[rid] = await engine.generate(request(rid, prompt(base), max_new_tokens=3))

    async with running(engine), trio.open_nursery() as nursery:
        nursery.start_soon(submit, "a", 0)
        await trio.sleep(0.001)
        nursery.start_soon(submit, "b", 10_000)
    a, b = results["a"], results["b"]
    assert a.queue_s == 0.0
    assert b.queue_s == pytest.approx(a.e2e_s - 0.001, rel=1e-9)
    assert b.ttft_s == pytest.approx(b.queue_s + COST.prefill_s(PROMPT, 0), rel=1e-9)
    assert engine.kv.statistics().rejected_admissions == 2  # tried in each of a's decode steps
    assert_no_leases(engine)


async def test_prefetch_in_decode_steps_turns_a_host_hit_into_a_gpu_hit(autojump_clock):
    engine = make_engine(policy="pbkv")
    kv = engine.kv
    kv.on_workflow_started("w")
    kv.on_forecast("w", np.array([[0.0, 1.0, 0.0]]), ("planner", "coder"))
    async with running(engine):
        await engine.generate(
            request("a", prompt(0), max_new_tokens=1, workflow="w", agent="coder")
        )
        assert kv.tree.evict("gpu", 31) == 31  # all of it demoted to the host
        # a long pure-decode request: its idle steps prefetch the coder's prefix back
        await engine.generate(request("d", prompt(50_000, 16), max_new_tokens=40))
        again = await engine.generate(request("a2", prompt(0), workflow="w", agent="coder"))
    assert (again.cached_gpu_tokens, again.cached_host_tokens) == (31 * BS, 0)
    assert again.ttft_s == pytest.approx(COST.prefill_s(PROMPT - 31 * BS, 31 * BS), rel=1e-12)
    s = kv.statistics()
    assert (s.prefetch_issued_blocks, s.prefetch_used_blocks, s.prefetch_wasted_blocks) == (
        31,
        31,
        0,
    )
    assert engine.statistics().prefetch_steps == 1
    assert_no_leases(engine)


def _workload_figures(seed: int):
    """Serve a fixed, contended workload in fresh virtual time; return every figure."""
    seed_scheduler(seed)

    async def main():
        engine = make_engine(gpu_blocks=90, host_blocks=64)
        results = {}

        async def submit(i):
            await trio.sleep(0.01 * (i % 3))
            shared = prompt(0, 256) + prompt(1_000 * (i % 4) + 5_000, 200)
            results[i] = await engine.generate(request(f"r{i}", shared, max_new_tokens=3 + i % 5))

        async with running(engine), trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(submit, i)
        assert_no_leases(engine)
        return results, engine.statistics(), engine.kv.statistics()

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_same_inputs_give_identical_figures():
    first = _workload_figures(seed=3)
    assert _workload_figures(seed=3) == first
    results, _, kv = first
    assert len(results) == 10
    assert kv.cached_gpu_tokens > 0  # the shared preamble is reused


async def test_a_cancelled_engine_fails_its_requests_and_leaves_no_lease(autojump_clock):
    """Cancelled mid-load (a host reload in flight): the caller gets EngineError and the
    tree holds no lease or private block, so an engine restarted over it starts clean."""
    engine = make_engine(gpu_blocks=80)
    errors = []

    async def caller(req):
        try:
            await engine.generate(req)
        except EngineError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as outer, trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        for rid, base in (("a", 0), ("b", 10_000), ("c", 20_000)):
            await engine.generate(request(rid, prompt(base)))  # a's tail goes to host
        outer.start_soon(caller, request("a2", prompt(0)))  # reloads a's tail
        await trio.sleep(COST.transfer_s(BYTES_PER_BLOCK))  # the reload is in flight
        assert engine._pending_loads
        nursery.cancel_scope.cancel()
    assert errors == ["engine stopped"]
    assert not engine._pending_loads
    assert_no_leases(engine)
    assert not any(n.loading for n in engine.kv.tree.nodes())
    async with running(engine):  # restarted over the same KV manager
        again = await engine.generate(request("a3", prompt(0)))
    assert again.cached_gpu_tokens + again.cached_host_tokens > 0
    assert_no_leases(engine)


# -- cancellation and requests that can never fit (issue 9) --------------------------------


async def test_a_caller_cancelled_while_prefilling_takes_its_request_out(autojump_clock):
    # 4000 tokens in 128-token chunks: 32 prefill steps, 251 blocks reserved
    engine = make_engine(gpu_blocks=300, host_blocks=0, max_prefill_tokens=128)
    first_chunk_s = COST.step_s([(128, 0)], 0, 0)
    async with running(engine):
        with trio.move_on_after(2.5 * first_chunk_s) as scope:
            await engine.generate(request("long", prompt(0, 4000), max_new_tokens=16))
        assert scope.cancelled_caught
        assert engine._running == [] and not engine._waiting  # gone at once
        assert_no_leases(engine)
        assert engine.kv.tree.nodes() == []  # nothing of it was committed
        await trio.sleep(100.0)  # long past when it would have finished
        assert engine.kv.tree.nodes() == []
        ok = await engine.generate(request("next", prompt(0, 100)))
    assert ok.computed_tokens == 100
    assert_no_leases(engine)


async def test_a_caller_cancelled_while_decoding_or_queued_releases_everything(autojump_clock):
    engine = make_engine(gpu_blocks=40, host_blocks=0)  # room for one 32-block request
    async with running(engine):
        prefill_s = COST.prefill_s(PROMPT, 0)
        async with trio.open_nursery() as nursery:

            async def queued():
                with trio.move_on_after(prefill_s):  # cancelled while "a" holds the GPU
                    await engine.generate(request("b", prompt(10_000), max_new_tokens=3))

            nursery.start_soon(queued)
            with trio.move_on_after(prefill_s + 3 * COST.decode_step_s(1, PROMPT)):
                await engine.generate(request("a", prompt(0), max_new_tokens=100))
        assert engine._running == [] and not engine._waiting
        assert_no_leases(engine)
        # "a"'s prompt was committed before it was cancelled: it stays cached
        again = await engine.generate(request("a2", prompt(0), max_new_tokens=2))
    assert again.cached_gpu_tokens == (PROMPT // BS) * BS
    assert_no_leases(engine)


async def test_a_cancelled_request_leaves_its_workflow_nothing_unretired(autojump_clock):
    engine = make_engine(policy="he", gpu_blocks=300, host_blocks=0, max_prefill_tokens=128)
    kv = engine.kv
    kv.on_workflow_started("w")
    async with running(engine):
        await engine.generate(request("w/0", prompt(0, 256), workflow="w", agent="coder"))
        with trio.move_on_after(COST.step_s([(128, 256)], 0, 0)):
            await engine.generate(request("w/1", prompt(0, 4000), workflow="w", agent="coder"))
        kv.on_workflow_terminated("w")  # the workflow gave up on it
        await trio.sleep(100.0)
    assert kv.tree.cached_blocks("gpu") == 256 // BS  # only the finished request's blocks
    assert all(n.retired and not n.accessors for n in kv.tree.nodes())
    assert_no_leases(engine)


async def test_a_request_that_can_never_fit_fails_at_once(autojump_clock):
    engine = make_engine(gpu_blocks=40, host_blocks=0)
    outcome = {}
    async with running(engine), trio.open_nursery() as nursery:

        async def submit(rid, tokens, new):
            outcome[rid] = await engine.generate(request(rid, tokens, max_new_tokens=new))

        nursery.start_soon(submit, "a", prompt(0), 100)  # holds 38 of the 40 blocks
        await trio.sleep(0.001)
        nursery.start_soon(submit, "b", prompt(10_000), 3)  # waits: head of the queue
        await trio.sleep(0.001)
        t0 = trio.current_time()
        with pytest.raises(RequestTooLarge, match="needs 63 GPU blocks; the tier holds 40"):
            await engine.generate(request("huge", prompt(20_000, 1000), max_new_tokens=8))
        assert trio.current_time() == t0  # not queued behind "a" and "b"
    assert set(outcome) == {"a", "b"}
    assert not RequestTooLarge("x").retryable and EngineError("x").retryable
    assert_no_leases(engine)


def retracting_engine(gpu_blocks, **sim) -> SimEngine:
    engine = make_engine(gpu_blocks=gpu_blocks, **sim)
    engine.scheduler = WorkflowScheduler(cohort_fill=None, preempt=True)
    return engine


async def test_a_retracted_request_resumes_with_the_same_output_streamed_once(autojump_clock):
    async def serve(retract: bool):
        engine = retracting_engine(gpu_blocks=40)  # room for one 32-block request
        engine.kv.on_workflow_started("old")
        engine.kv.on_workflow_started("young")
        streamed: list[int] = []
        script = tuple(range(100, 140))
        young = GenerateRequest(
            "young", "young", "a", prompt(10_000), 40, scripted_output_token_ids=script,
            on_token=streamed.append,
        )  # fmt: skip
        results = {}

        async def submit(rid, req):
            results[rid] = await engine.generate(req)

        async with running(engine), trio.open_nursery() as nursery:
            nursery.start_soon(submit, "young", young)
            await trio.sleep(COST.prefill_s(PROMPT, 0) + 10 * COST.decode_step_s(1, PROMPT))
            if retract:  # an older workflow's request that cannot fit beside it
                nursery.start_soon(submit, "old", request("old", prompt(0), workflow="old"))
        assert_no_leases(engine)
        return results, streamed, engine.statistics().retractions

    alone, streamed_alone, none = await serve(retract=False)
    both, streamed_both, once = await serve(retract=True)
    assert (none, once) == (0, 1)
    assert (
        both["young"].output_token_ids == alone["young"].output_token_ids == tuple(range(100, 140))
    )
    assert streamed_both == streamed_alone == list(range(100, 140))  # nothing streamed twice
    assert both["young"].ttft_s == alone["young"].ttft_s  # its first token came before
    assert both["young"].e2e_s > alone["young"].e2e_s  # it waited for "old"
    assert both["old"].queue_s < COST.decode_step_s(1, PROMPT)  # admitted at once


async def test_a_big_request_behind_many_small_ones_is_admitted(autojump_clock):
    async def serve(preempt: bool):
        engine = make_engine(gpu_blocks=40)  # five 8-block small requests fill it
        engine.scheduler = WorkflowScheduler(cohort_fill=None, preempt=preempt, max_bypass=1000)
        engine.kv.on_workflow_started("old")
        for w in range(6):
            engine.kv.on_workflow_started(f"young-{w}")
        results = {}

        async def small_workflow(w):
            for i in range(6):
                rid = f"small-{w}-{i}"
                tokens = prompt(20_000 + 1000 * (6 * w + i), 100)
                results[rid] = await engine.generate(request(rid, tokens, 30, f"young-{w}"))

        async with running(engine), trio.open_nursery() as nursery:
            for w in range(6):
                nursery.start_soon(small_workflow, w)
            await trio.sleep(0.5)
            big = await engine.generate(request("big", prompt(0), 5, workflow="old"))
        assert big.output_token_ids == (7, 8, 0, 0, 0)
        assert len(results) == 36
        assert all(r.output_token_ids == (7, 8) + (0,) * 28 for r in results.values())
        assert engine.kv.statistics().requests == 37  # resumptions are not new requests
        assert_no_leases(engine)
        return big.queue_s, engine.statistics().retractions

    queue_s, retractions = await serve(preempt=True)
    assert queue_s < 0.1 and 1 <= retractions <= 2 * 36  # each retracted at most twice
    queue_s, retractions = await serve(preempt=False)
    assert queue_s > 1.0 and retractions == 0  # it waits for the small ones to drain


def test_the_prefill_share_follows_the_steps_and_decays_when_idle():
    engine = make_engine()
    assert engine.prefill_share is None  # nothing measured yet
    for _ in range(60):  # recompute-bound: prefill is all of every step
        engine._note_busy(1.0, 1.0)
    assert engine.prefill_share > 0.99
    for _ in range(60):  # decode takes over
        engine._note_busy(1.0, 0.1)
    assert 0.1 < engine.prefill_share < 0.15
    engine._note_idle(1000.0)
    assert engine.prefill_share < 1e-6


async def test_the_sim_engine_measures_its_prefill_share(autojump_clock):
    engine = make_engine()
    async with running(engine):
        await engine.generate(request("a", prompt(0, 400), max_new_tokens=1))  # prefill only
        after_prefill = engine.prefill_share
        await engine.generate(request("b", prompt(5_000, 16), max_new_tokens=200))  # decode
    assert after_prefill is not None and after_prefill > 0.0
    assert engine.prefill_share < after_prefill


async def _decode_beside_a_long_prefill(engine: SimEngine):
    """A short request decodes 40 tokens; 1 s in, a 3,000-token prompt arrives."""
    results = {}
    async with running(engine), trio.open_nursery() as nursery:

        async def go(rid, tokens, new, delay_s):
            await trio.sleep(delay_s)
            results[rid] = await engine.generate(request(rid, tokens, max_new_tokens=new))

        nursery.start_soon(go, "decoder", prompt(0, 100), 40, 0.0)
        nursery.start_soon(go, "long", prompt(10_000, 3000), 1, 1.0)
    return results["decoder"], results["long"]


async def test_balanced_batches_keep_decodes_going_beside_a_long_prefill(autojump_clock):
    fixed = make_engine(gpu_blocks=400)
    balanced = make_engine(gpu_blocks=400)
    balanced.scheduler = WorkflowScheduler(cohort_fill=None)  # balanced_prefill by default
    assert not fixed.scheduler.balanced_prefill and balanced.scheduler.balanced_prefill
    dec_fixed, long_fixed = await _decode_beside_a_long_prefill(fixed)
    dec_balanced, long_balanced = await _decode_beside_a_long_prefill(balanced)
    # fixed: the whole prompt in one compute-bound step, in which the decoder gains one token
    assert fixed.statistics().steps == 40  # 1 + 39 decode steps, one of them the prompt
    slack = COST.prefill_slack_tokens(1, 100 + 10)  # what a one-sequence decode step carries
    # balanced: the prompt rides the decode steps in slack-sized chunks, then the rest at once
    assert slack == 119 and balanced.statistics().steps == 41
    assert dec_balanced.e2e_s < dec_fixed.e2e_s - 1.3  # 2.32 s against 3.70: no stall
    assert long_balanced.ttft_s < long_fixed.ttft_s * 1.01  # and prefill runs as fast
    assert balanced.statistics().prefill_tokens == fixed.statistics().prefill_tokens


def test_the_prefill_budget_is_the_slack_only_for_balanced_schedulers():
    engine = make_engine(max_prefill_tokens=4096)
    assert engine._prefill_budget(8, 8_000) == 4096  # fcfs: the fixed chunk
    engine.scheduler = WorkflowScheduler(cohort_fill=None)
    assert engine._prefill_budget(8, 8_000) == COST.prefill_slack_tokens(8, 8_000)
    assert engine._prefill_budget(0, 0) == 4096  # nothing decodes: nothing to stall
    engine.scheduler = WorkflowScheduler(cohort_fill=None, balanced_prefill=False)
    assert engine._prefill_budget(8, 8_000) == 4096


def test_a_decode_step_that_hides_no_prefill_keeps_the_whole_chunk():
    """On hardware that overlaps none of a step's compute with its reads (a CPU), a
    decode step has no idle compute to fill: balanced chunks would hide nothing and only
    add steps, so the chunk stays whole. With the roofline's overlap the same machine's
    decode step carries its slack."""
    cpu = dataclasses.replace(
        load_hardware("cpu-2core"),
        peak_flops_per_s=8e10,
        memory_bandwidth_bytes_per_s=3e9,
        step_overhead_s=0.0,
        sequence_overhead_s=0.0,
        overlap=0.0,
    )
    smollm2 = load_model("smollm2-135m")
    engine = make_engine(max_prefill_tokens=4096)
    engine.scheduler = WorkflowScheduler(cohort_fill=None)
    engine.cost = CostModel(cpu, smollm2)
    assert engine.cost.prefill_slack_tokens(4, 2_000) == 0
    assert engine._prefill_budget(4, 2_000) == 4096
    engine.cost = CostModel(dataclasses.replace(cpu, overlap=1.0), smollm2)
    assert 16 <= engine.cost.prefill_slack_tokens(4, 2_000) < 4096  # the roofline's slack
    assert engine._prefill_budget(4, 2_000) == engine.cost.prefill_slack_tokens(4, 2_000)
    assert engine.cost.prefill_slack_tokens(128, 1_000) == 0  # compute-bound: one block
    assert engine._prefill_budget(128, 1_000) == BS


def test_the_scheduler_is_told_the_cost_models_forward_and_token_seconds():
    engine = make_engine()
    costs = engine._forward_costs()
    assert costs.forward_s == pytest.approx(COST.decode_step_s(1, 1), rel=0.01)  # the weights
    assert costs.prefill_token_s == 2 * COST.model.num_params / COST.compute_flops_per_s


async def _twins_beside_a_decoder(engine: SimEngine):
    """A request decodes 60 tokens; 1 s in, two requests with one 2,000-token prompt arrive."""
    results = {}
    async with running(engine), trio.open_nursery() as nursery:

        async def go(rid, tokens, new, delay_s):
            await trio.sleep(delay_s)
            results[rid] = await engine.generate(request(rid, tokens, max_new_tokens=new))

        nursery.start_soon(go, "decoder", prompt(0, 100), 60, 0.0)
        nursery.start_soon(go, "twin-a", prompt(10_000, 2000), 1, 1.0)
        nursery.start_soon(go, "twin-b", prompt(10_000, 2000), 1, 1.0)
    return results["twin-a"], results["twin-b"]


async def test_a_request_waits_for_the_blocks_a_running_one_is_computing(autojump_clock):
    waits = make_engine(gpu_blocks=400)
    waits.scheduler = WorkflowScheduler(cohort_fill=None)
    assert waits.scheduler.wait_for_computing
    twice = make_engine(gpu_blocks=400)
    twice.scheduler = WorkflowScheduler(cohort_fill=None)
    twice.scheduler.wait_for_computing = False
    a, b = await _twins_beside_a_decoder(waits)
    first, second = sorted((a, b), key=lambda r: r.ttft_s)
    assert first.cached_gpu_tokens == 0
    # chunks are committed as they land, and the twin waits for them: it hits all but the tail
    assert second.cached_gpu_tokens == 2000 // BS * BS
    assert waits.statistics().prefill_tokens == 100 + 2000 + 1  # + its last token, for logits
    await _twins_beside_a_decoder(twice)
    assert twice.statistics().prefill_tokens == 100 + 2 * 2000  # both compute the prompt


async def test_on_token_returning_true_ends_the_request_at_that_token(autojump_clock):
    engine = make_engine()
    seen: list[int] = []

    def stop_at_second(token: int) -> bool:
        seen.append(token)
        return len(seen) == 2

    ask = GenerateRequest(
        "stop",
        None,
        "",
        prompt(0),
        50,
        scripted_output_token_ids=(7, 8, 9),
        on_token=stop_at_second,
    )
    async with running(engine):
        result = await engine.generate(ask)
        again = await engine.generate(request("again", prompt(0) + result.output_token_ids))
    assert result.output_token_ids == (7, 8) == tuple(seen)
    assert engine.statistics().decode_tokens == 1 + 4  # its one decode step, then again's
    assert again.cached_gpu_tokens == (PROMPT + 2) // BS * BS
    assert_no_leases(engine)
