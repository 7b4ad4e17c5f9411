"""Tests for engines/torchengine/ (the real engine over paged KV) and the demote hook it uses.

Correctness bar (§7.2): greedy tokens and the last prefill token's logits after a full
recompute, a GPU-tier hit and a host-tier reload match a plain transformers forward of
the whole sequence, on the tiny random model and once on SmolLM2. Every engine here
checks the KV manager's invariants after every step.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import asynccontextmanager

import numpy as np
import pytest
import torch
import trio

from pbkv.engines.base import (
    EngineError,
    GenerateRequest,
    GenerateResult,
    RequestTooLarge,
    Sampling,
)
from pbkv.engines.scheduler import WorkflowScheduler, get_scheduler
from pbkv.engines.torchengine import (
    BlockCopy,
    KVLayout,
    PagedKVPools,
    TorchEngine,
    TorchEngineConfig,
    load_model,
    make_kv_config,
)
from pbkv.engines.torchengine.pool import _runs
from pbkv.kvmanager import AdmitRequest, KVConfig, KVManager

BS = 4
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return load_model("tiny", device="cpu")


def make_engine(
    model: torch.nn.Module,
    *,
    gpu: int = 64,
    host: int = 128,
    policy: str = "lru",
    max_prefill_tokens: int = 512,
) -> tuple[KVManager, TorchEngine]:
    config = make_kv_config(
        model,
        block_size=BS,
        gpu_capacity_blocks=gpu,
        host_capacity_blocks=host,
        policy=policy,
        bandwidth_bytes_per_s=1e12,
    )
    kv = KVManager(config, trio.current_time)
    engine_config = TorchEngineConfig(
        max_prefill_tokens=max_prefill_tokens, stop_token_ids=(), check_integrity=True
    )
    return kv, TorchEngine(kv, model, engine_config)


@asynccontextmanager
async def running(engine: TorchEngine):
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield
        nursery.cancel_scope.cancel()


def random_prompt(n: int, seed: int, vocab: int = 49152) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(0, vocab, n))


def request(rid: str, prompt: tuple[int, ...], new: int = 6, **kw) -> GenerateRequest:
    return GenerateRequest(
        rid, kw.pop("workflow_id", None), kw.pop("agent", "a"), prompt, new, **kw
    )


def reference(model: torch.nn.Module, prompt: tuple[int, ...], new: int):
    """Greedy tokens and the last prompt token's logits from full forwards, no cache."""
    device = next(model.parameters()).device
    ids, out, first = list(prompt), [], None
    with torch.inference_mode():
        for _ in range(new):
            logits = model(torch.tensor([ids], device=device)).logits[0, -1].float().cpu()
            first = logits if first is None else first
            out.append(int(logits.argmax()))
            ids.append(out[-1])
    return tuple(out), first


def logits_of(model: torch.nn.Module, result: GenerateResult) -> torch.Tensor:
    """Last-prefill logits, from the result's post-norm hidden state."""
    weight = next(model.parameters())
    hidden = torch.from_numpy(result.hidden).to(weight.device, weight.dtype)
    with torch.inference_mode():
        return model.get_output_embeddings()(hidden).float().cpu()


def tiers(result: GenerateResult) -> tuple[int, int, int]:
    return result.cached_gpu_tokens, result.cached_host_tokens, result.computed_tokens


# -- the demote hook (kvmanager/radix.py, kvmanager/manager.py) ---------------------------


def test_demote_hook_reports_each_device_to_host_copy_once() -> None:
    kv = KVManager(
        KVConfig(block_size=1, gpu_capacity_blocks=4, host_capacity_blocks=4), lambda: 0.0
    )
    calls: list[tuple[list[int], list[int]]] = []
    kv.set_demote_hook(lambda node, gpu, host: calls.append((list(gpu), list(host))))
    adm = kv.try_admit(AdmitRequest(keys=[11, 12, 13], prompt_tokens=3, max_new_tokens=1))
    assert adm is not None
    kv.commit(adm, [11, 12, 13])
    kv.release(adm)
    assert kv.tree.evict("gpu", 3) == 3
    assert calls == [([0, 1, 2], [0, 1, 2])]
    load = kv.try_admit(AdmitRequest(keys=[11, 12, 13], prompt_tokens=3, max_new_tokens=1))
    assert load is not None and load.cached_host_tokens == 3
    kv.complete_load(load.loads[0], ok=True)
    kv.release(load)
    kv.tree.evict("gpu", 3)  # the host copy exists: no copy needed
    assert len(calls) == 1
    kv.set_demote_hook(None)
    kv.check_integrity()


def test_demote_hook_not_called_when_the_host_tier_cannot_take_the_node() -> None:
    kv = KVManager(
        KVConfig(block_size=1, gpu_capacity_blocks=4, host_capacity_blocks=0), lambda: 0.0
    )
    calls: list[object] = []
    kv.set_demote_hook(lambda *args: calls.append(args))
    adm = kv.try_admit(AdmitRequest(keys=[1, 2], prompt_tokens=2, max_new_tokens=1))
    assert adm is not None
    kv.commit(adm, [1, 2])
    kv.release(adm)
    kv.tree.evict("gpu", 2)
    assert calls == [] and kv.statistics().dropped_blocks == 2


# -- pools -------------------------------------------------------------------------------


def test_pools_write_gather_and_copy_between_tiers_round_trip() -> None:
    layout = KVLayout(layers=2, kv_heads=3, head_dim=5, block_size=BS, dtype=torch.float32)
    pools = PagedKVPools(layout, gpu_blocks=10, host_blocks=6, device=torch.device("cpu"))
    assert pools.gpu.shape == (2, 2, 10, BS, 3, 5) and pools.host.shape == (2, 2, 6, BS, 3, 5)
    kv = [(torch.randn(1, 3, 14, 5), torch.randn(1, 3, 14, 5)) for _ in range(2)]
    slots = torch.tensor([b * BS + t for b in (5, 2, 3, 8) for t in range(BS)][:14])
    for layer, (k, v) in enumerate(kv):  # the forward's writes: one slot per token
        keys, values = pools.layer_kv(layer)
        assert keys.shape == (10 * BS, 3, 5)
        keys.index_copy_(0, slots, k[0].transpose(0, 1))
        values.index_copy_(0, slots, v[0].transpose(0, 1))
    for (k, v), (gk, gv) in zip(kv, pools.gather([5, 2, 3], 11), strict=True):
        assert gk.shape == (1, 3, 11, 5)
        torch.testing.assert_close(gk, k[:, :, :11], rtol=0, atol=0)
        torch.testing.assert_close(gv, v[:, :, :11], rtol=0, atol=0)
    assert pools.copy([BlockCopy(True, (5, 2, 3), (0, 1, 2))]).ready()
    pools.copy([BlockCopy(False, (0, 1, 2), (7, 8, 9))])
    torch.testing.assert_close(pools.gather([7, 8, 9], 12), pools.gather([5, 2, 3], 12))
    with pytest.raises(ValueError, match="cannot hold"):
        pools.gather([1], BS + 1)


def test_copy_runs_coalesce_ids_consecutive_on_both_sides() -> None:
    assert _runs([4, 5, 6, 9, 10], [0, 1, 7, 8, 9]) == [(4, 0, 2), (6, 7, 1), (9, 8, 2)]
    assert _runs([], []) == []


# -- correctness: recompute, GPU hit, host reload ----------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("prompt_tokens", "chunk"), [(37, 512), (36, 512), (37, 8)])
async def test_recompute_gpu_hit_and_host_reload_give_the_same_tokens_and_logits(
    tiny: torch.nn.Module, device: str, prompt_tokens: int, chunk: int
) -> None:
    model = tiny if device == "cpu" else load_model("tiny", device=device, dtype=torch.float32)
    kv, engine = make_engine(model, max_prefill_tokens=chunk)
    prompt = random_prompt(prompt_tokens, seed=prompt_tokens)
    want_tokens, want_logits = reference(model, prompt, 6)
    cached = prompt_tokens // BS * BS
    async with running(engine):
        miss = await engine.generate(request("miss", prompt))
        hit = await engine.generate(request("hit", prompt))
        kv.tree.evict("gpu", kv.config.gpu_capacity_blocks)  # demote everything
        reload = await engine.generate(request("reload", prompt))
    assert tiers(miss) == (0, 0, prompt_tokens)
    assert tiers(hit) == (cached, 0, prompt_tokens - cached)
    assert tiers(reload) == (0, cached, prompt_tokens - cached)
    for result in (miss, hit, reload):
        assert result.output_token_ids == want_tokens
        torch.testing.assert_close(logits_of(model, result), want_logits, rtol=1e-4, atol=1e-4)
    stats = engine.statistics()
    sequence_blocks = (prompt_tokens + 5) // BS  # prompt + output but the last token
    assert (stats.d2h_blocks, stats.h2d_blocks) == (sequence_blocks, cached // BS)
    recomputed = max(1, prompt_tokens - cached)  # a full hit still runs its last token
    assert stats.prefill_tokens == prompt_tokens + 2 * recomputed
    kv.check_integrity()


async def test_a_prompt_extending_an_earlier_output_hits_the_output_blocks(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny)
    first_prompt = random_prompt(30, seed=1)
    async with running(engine):
        first = await engine.generate(request("first", first_prompt))
        prompt = first_prompt + first.output_token_ids + random_prompt(9, seed=2)
        second = await engine.generate(request("second", prompt, new=4))
    assert tiers(second) == (32, 0, 45 - 32)  # 30 + 5 computed tokens → 8 full blocks
    want_tokens, want_logits = reference(tiny, prompt, 4)
    assert second.output_token_ids == want_tokens
    torch.testing.assert_close(logits_of(tiny, second), want_logits, rtol=1e-4, atol=1e-4)


async def test_hidden_is_the_post_norm_state_of_the_last_prompt_token(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny)
    prompt = random_prompt(21, seed=3)
    async with running(engine):
        result = await engine.generate(request("h", prompt, new=1))
    assert result.hidden is not None and result.hidden.shape == (96,)
    with torch.inference_mode():
        out = tiny(torch.tensor([prompt]), output_hidden_states=True)
        pre_norm = tiny.model(torch.tensor([prompt])).last_hidden_state
    last = out.hidden_states[-1][0, -1]
    torch.testing.assert_close(torch.from_numpy(result.hidden), last, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tiny.lm_head(last), out.logits[0, -1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pre_norm[0, -1], last)  # LlamaModel's output is normed


# -- scheduling: interleaving, pressure, prefetch ------------------------------------------


async def test_concurrent_requests_interleave_and_match_solo_runs_under_eviction(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny, gpu=40, host=24, max_prefill_tokens=16)
    shared = random_prompt(24, seed=4)
    specs = [(9, 12), (14, 3), (21, 7), (5, 5), (30, 4)]  # (suffix tokens, new tokens)
    prompts = [shared + random_prompt(n, seed=10 + i) for i, (n, _) in enumerate(specs)]
    results: dict[int, GenerateResult] = {}
    finished: list[int] = []

    async def one(i: int) -> None:
        results[i] = await engine.generate(request(f"r{i}", prompts[i], new=specs[i][1]))
        finished.append(i)

    async with running(engine), trio.open_nursery() as nursery:
        for i in range(len(specs)):
            nursery.start_soon(one, i)
            await trio.sleep(0)
    for i, (_, new) in enumerate(specs):
        assert results[i].output_token_ids == reference(tiny, prompts[i], new)[0]
    assert finished.index(1) < finished.index(0)  # 3 tokens submitted after 12 finish first
    # the GPU tier holds three of them at once; the last two wait and then hit the prefix
    assert [sum(tiers(results[i])[:2]) for i in (3, 4)] == [24, 24]
    assert kv.statistics().demoted_blocks > 0
    stats = engine.statistics()
    assert stats.decode_tokens == sum(new - 1 for _, new in specs)
    assert stats.decode_forwards < stats.decode_tokens  # decodes were batched
    kv.check_integrity()


async def test_prefetch_brings_a_predicted_prefix_back_during_pure_decode(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny, gpu=32, host=64, policy="pbkv")
    prompt = random_prompt(30, seed=5)
    kv.on_workflow_started("w")
    async with running(engine):
        await engine.generate(request("first", prompt, new=2, workflow_id="w", agent="coder"))
        kv.tree.evict("gpu", 32)
        kv.on_forecast("w", np.array([[1.0, 0.0]] * 3), ("coder",))
        await engine.generate(request("other", random_prompt(8, seed=6), new=6))
        again = await engine.generate(
            request("again", prompt, new=2, workflow_id="w", agent="coder")
        )
    assert engine.statistics().prefetch_steps >= 1
    assert tiers(again) == (28, 0, 2)
    assert kv.statistics().prefetch_used_blocks >= 7
    assert again.output_token_ids == reference(tiny, prompt, 2)[0]


# -- errors ---------------------------------------------------------------------------------


async def test_bad_requests_raise_and_the_engine_keeps_serving(tiny: torch.nn.Module) -> None:
    kv, engine = make_engine(tiny, gpu=8)
    async with running(engine):
        with pytest.raises(ValueError, match="empty prompt"):
            await engine.generate(request("e", ()))
        with pytest.raises(ValueError, match="max_new_tokens"):
            await engine.generate(request("n", (1, 2), new=0))
        with pytest.raises(ValueError, match="outside"):
            await engine.generate(request("v", (1, 49152)))
        with pytest.raises(EngineError, match="GPU blocks"):
            await engine.generate(request("big", random_prompt(40, seed=7)))
        ok = await engine.generate(request("ok", random_prompt(10, seed=8), new=2))
    assert len(ok.output_token_ids) == 2
    kv.check_integrity()


async def test_a_tiny_temperature_samples_the_argmax_instead_of_failing(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny)
    prompt = random_prompt(19, seed=41)
    async with running(engine):
        cold = await engine.generate(request("cold", prompt, 4, sampling=Sampling(1e-45)))
    assert cold.output_token_ids == reference(tiny, prompt, 4)[0]  # logits / 1e-45: inf


async def serve_beside_a_failing_request(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, *, fail_in: str
) -> tuple[TorchEngine, dict[str, GenerateResult | BaseException], dict[str, tuple[int, ...]]]:
    """Serve "good" and "bad" together (their decodes batch), the bad one's own work
    raising in ``fail_in`` ("sample" or "forward") from its third token on; then "after"."""
    kv, engine = make_engine(model)
    prompts = {rid: random_prompt(14 + i, seed=50 + i) for i, rid in enumerate(("good", "bad"))}
    prompts["after"] = random_prompt(9, seed=52)
    outcomes: dict[str, GenerateResult | BaseException] = {}

    def is_bad(entry) -> bool:
        return entry.request.request_id == "bad" and len(entry.output) >= 2

    if fail_in == "sample":
        sample = engine.worker._sample

        def failing_sample(entry, logits, argmax):
            if is_bad(entry):
                raise RuntimeError("probability tensor contains nan")
            return sample(entry, logits, argmax)

        monkeypatch.setattr(engine.worker, "_sample", failing_sample)
    else:
        forward = engine.worker._forward

        def failing_forward(rows):  # a packed forward with the bad row, or the row alone
            if any(is_bad(row.entry) for row in rows):
                raise RuntimeError("CUDA error: device-side assert triggered")
            return forward(rows)

        monkeypatch.setattr(engine.worker, "_forward", failing_forward)

    async def one(rid: str) -> None:
        try:
            outcomes[rid] = await engine.generate(request(rid, prompts[rid], new=8))
        except EngineError as exc:
            outcomes[rid] = exc

    async with running(engine):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "good")
            nursery.start_soon(one, "bad")
        await one("after")
    kv.check_integrity()
    assert kv.tree.lease_count() == 0 and kv.tree.private_blocks("gpu") == 0
    return engine, outcomes, prompts


@pytest.mark.parametrize("fail_in", ["sample", "forward"])
async def test_a_request_whose_own_work_raises_fails_alone(
    tiny: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, fail_in: str
) -> None:
    engine, outcomes, prompts = await serve_beside_a_failing_request(
        tiny, monkeypatch, fail_in=fail_in
    )
    assert isinstance(outcomes["bad"], EngineError)
    assert str(outcomes["bad"]).startswith("request bad: RuntimeError: ")
    for rid in ("good", "after"):  # the batch it shared and the engine carried on, exactly
        result = outcomes[rid]
        assert isinstance(result, GenerateResult), result
        assert result.output_token_ids == reference(tiny, prompts[rid], 8)[0]
    assert engine.statistics().decode_forwards > 0


async def test_a_caller_cancelled_mid_prefill_takes_its_request_out(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny, gpu=64, host=0, max_prefill_tokens=8)
    prompt = random_prompt(200, seed=9)  # 25 prefill steps, 52 blocks reserved
    async with running(engine):
        with trio.CancelScope() as scope:

            async def cancel_mid_prefill() -> None:
                while not (engine._running and 0 < engine._running[0].pos < 100):
                    await trio.sleep(0.001)
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_mid_prefill)
                await engine.generate(request("long", prompt, new=4))
        assert scope.cancelled_caught
        with trio.fail_after(10):  # out at the end of the step in flight
            while engine._running:
                await trio.sleep(0.001)
        kv.check_integrity()
        assert kv.tree.private_blocks("gpu") == 0 and kv.tree.nodes() == []
        ok = await engine.generate(request("ok", prompt[:20], new=2))
    assert ok.output_token_ids == reference(tiny, prompt[:20], 2)[0]
    kv.check_integrity()
    assert all(n.lock_count == 0 for n in kv.tree.nodes())


async def test_a_request_that_can_never_fit_fails_before_queueing(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny, gpu=8)
    with trio.fail_after(5), pytest.raises(RequestTooLarge, match="needs 12 GPU blocks; the tier"):
        await engine.generate(request("big", random_prompt(40, seed=7)))  # engine not running
    assert not engine._waiting


@pytest.mark.parametrize("device", DEVICES)
async def test_a_failed_step_waits_for_its_issued_copies_before_freeing(
    tiny: torch.nn.Module, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny if device == "cpu" else load_model("tiny", device=device, dtype=torch.float32)
    kv, engine = make_engine(model)
    prompt = random_prompt(40, seed=11)
    events: list[str] = []
    synchronize, complete_load = engine.pools.synchronize, kv.complete_load

    def spy_synchronize() -> None:
        events.append("synchronize")
        synchronize()

    def spy_complete_load(load, *, ok: bool) -> None:
        events.append(f"complete_load(ok={ok})")
        complete_load(load, ok=ok)

    def failing_forward(rows) -> None:  # after the step's copies were issued
        raise RuntimeError("kernel fault")

    with pytest.RaisesGroup(
        pytest.RaisesExc(RuntimeError, match="kernel fault"),
        allow_unwrapped=True,
        flatten_subgroups=True,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await engine.generate(request("first", prompt))
            kv.tree.evict("gpu", kv.config.gpu_capacity_blocks)  # demote: a reload next
            monkeypatch.setattr(engine.pools, "synchronize", spy_synchronize)
            monkeypatch.setattr(kv, "complete_load", spy_complete_load)
            monkeypatch.setattr(engine.worker, "_forward", failing_forward)
            errors: list[str] = []

            async def caller(rid: str, tokens: tuple[int, ...]) -> None:
                try:
                    await engine.generate(request(rid, tokens))
                except EngineError as exc:
                    errors.append(str(exc))

            async with trio.open_nursery() as callers:  # one step: reload copies + a prefill
                callers.start_soon(caller, "reload", prompt)
                callers.start_soon(caller, "other", random_prompt(12, seed=12))
    assert len(errors) == 2 and all("kernel fault" in e for e in errors)
    assert "complete_load(ok=False)" in events
    assert events.index("synchronize") < events.index("complete_load(ok=False)")
    kv.check_integrity()
    assert kv.tree.private_blocks("gpu") == 0
    assert not any(n.loading or n.lock_count for n in kv.tree.nodes())


def test_a_kv_config_for_another_model_is_rejected(tiny: torch.nn.Module) -> None:
    config = KVConfig(
        block_size=BS, gpu_capacity_blocks=4, host_capacity_blocks=0, bytes_per_block=7
    )
    with pytest.raises(ValueError, match="make_kv_config"):
        TorchEngine(KVManager(config, lambda: 0.0), tiny)


# -- models -----------------------------------------------------------------------------------


def test_load_model_reads_a_checkpoint_directory_and_rejects_unknown_names(
    tiny: torch.nn.Module, tmp_path
) -> None:
    tiny.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, device="cpu")
    ids = torch.tensor([random_prompt(12, seed=9)])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(ids).logits, tiny(ids).logits)
    with pytest.raises(ValueError, match="smollm2, tiny"):
        load_model("no-such-model")


def test_importing_pbkv_engines_does_not_import_torch() -> None:
    code = (
        "import sys, pbkv.engines, pbkv.engines.base, pbkv.kvmanager; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_smollm2_recompute_gpu_hit_and_host_reload_agree() -> None:
    from pbkv.assets import TokenizerUnavailable, encode

    try:
        model = load_model("smollm2", device="cpu")
    except TokenizerUnavailable as exc:
        pytest.skip(f"SmolLM2's GGUF is not installed: {exc}")
    text = (
        "<|im_start|>system\nYou are a careful assistant who answers in one short sentence."
        "<|im_end|>\n<|im_start|>user\nName the largest planet of the solar system and say "
        "one fact about it.<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = encode(text)[:40]
    kv, engine = make_engine(model, gpu=32, host=32)
    want_tokens, want_logits = reference(model, prompt, 4)
    async with running(engine):
        miss = await engine.generate(request("miss", prompt, new=4))
        hit = await engine.generate(request("hit", prompt, new=4))
        kv.tree.evict("gpu", 32)
        reload = await engine.generate(request("reload", prompt, new=4))
    assert [tiers(r)[:2] for r in (miss, hit, reload)] == [(0, 0), (40, 0), (0, 40)]
    for result in (miss, hit, reload):
        assert result.output_token_ids == want_tokens
        torch.testing.assert_close(logits_of(model, result), want_logits, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize(
    "sampling", [Sampling(), Sampling(temperature=0.9, seed=5)], ids=["greedy", "seeded"]
)
async def test_a_retracted_request_resumes_to_the_same_tokens(
    tiny: torch.nn.Module, sampling: Sampling
) -> None:
    young_prompt, old_prompt = random_prompt(20, seed=31), random_prompt(22, seed=32)

    async def serve(retract: bool) -> tuple[GenerateResult, list[int], int]:
        kv, engine = make_engine(tiny, gpu=12, host=32)  # one 8-block request at a time
        engine.scheduler = WorkflowScheduler(cohort_fill=None, preempt=True)
        kv.on_workflow_started("old")
        kv.on_workflow_started("young")
        streamed: list[int] = []
        third = trio.Event()

        def on_token(token: int) -> None:
            streamed.append(token)
            if len(streamed) == 3:
                third.set()

        young = request(
            "young", young_prompt, 12, workflow_id="young", sampling=sampling, on_token=on_token
        )
        old = request("old", old_prompt, 9, workflow_id="old")
        results: dict[str, GenerateResult] = {}

        async def submit(req: GenerateRequest) -> None:
            results[req.request_id] = await engine.generate(req)

        async with running(engine), trio.open_nursery() as nursery:
            nursery.start_soon(submit, young)
            await third.wait()  # decoding: prompt committed, outputs not yet
            if retract:
                nursery.start_soon(submit, old)
        if retract:
            assert results["old"].output_token_ids == reference(tiny, old_prompt, 9)[0]
        assert kv.tree.lease_count() == 0 and kv.tree.private_blocks("gpu") == 0
        kv.check_integrity()
        return results["young"], streamed, engine.statistics().retractions

    alone, streamed_alone, none = await serve(retract=False)
    resumed, streamed_resumed, once = await serve(retract=True)
    assert (none, once) == (0, 1)
    assert resumed.output_token_ids == alone.output_token_ids
    assert streamed_resumed == streamed_alone == list(alone.output_token_ids)  # none twice
    if sampling.greedy:
        assert alone.output_token_ids == reference(tiny, young_prompt, 12)[0]
    assert np.allclose(resumed.hidden, alone.hidden)  # its prompt's, not the resumption's


# -- on_token ending a request early (a stop sequence, pbkv serve's ``stop``) -------------


async def test_on_token_returning_true_ends_the_request_at_that_token(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny)
    prompt = random_prompt(21, seed=5)
    want, _ = reference(tiny, prompt, 40)
    seen: list[int] = []

    def stop_at_third(token: int) -> bool:
        seen.append(token)
        return len(seen) == 3

    async with running(engine):
        stopped = await engine.generate(request("stop", prompt, 40, on_token=stop_at_third))
        decoded = engine.statistics().decode_tokens
        # what was committed is the sequence's own KV: extending it hits and decodes on
        again = await engine.generate(request("again", prompt + stopped.output_token_ids, 4))
    assert stopped.output_token_ids == want[:3] == tuple(seen)
    assert decoded == 2  # the first token comes from the prefill
    assert again.cached_gpu_tokens == (21 + 2) // BS * BS
    assert again.output_token_ids == want[3:7]
    assert kv.tree.lease_count() == 0
    kv.check_integrity()


# -- balanced (stall-free) batches and busy accounting (§7.0) --------------------------------


async def serve_decodes_beside_a_long_prompt(
    model: torch.nn.Module, scheduler: str, slack: int | None = None
) -> tuple[TorchEngine, list[tuple[int, frozenset[str], int]]]:
    """Serve two short requests, then, once they decode, a 400-token prompt (chunk cap
    128). With ``slack``, the engine's measured stall-free budget is pinned to it.

    Returns the engine and each step's (prefill tokens, decoding request ids, the long
    request's committed blocks after the step) while the long prompt prefills; every
    request's tokens are checked against a plain forward.
    """
    kv, engine = make_engine(model, gpu=160, host=0, max_prefill_tokens=128)
    engine.scheduler = get_scheduler(scheduler)
    if slack is not None:
        engine.costs.prefill_slack_tokens = lambda: slack  # type: ignore[method-assign]
    prompts = {"s0": random_prompt(10, seed=60), "s1": random_prompt(13, seed=61)}
    prompts["long"] = random_prompt(400, seed=62)
    steps: list[tuple[int, frozenset[str], int]] = []
    apply = engine._apply

    def recording_apply(plan) -> None:
        apply(plan)
        chunks = [c for c in plan.prefills if c.entry.request.request_id == "long"]
        if chunks:
            committed = chunks[0].entry.admission.committed_blocks
            decoding = frozenset(e.request.request_id for e in plan.decodes)
            steps.append((sum(c.tokens for c in plan.prefills), decoding, committed))

    engine._apply = recording_apply  # type: ignore[method-assign]
    results: dict[str, GenerateResult] = {}

    async def one(rid: str, new: int) -> None:
        results[rid] = await engine.generate(request(rid, prompts[rid], new=new))

    async with running(engine), trio.open_nursery() as nursery:
        nursery.start_soon(one, "s0", 60)
        nursery.start_soon(one, "s1", 60)
        while engine.statistics().decode_tokens < 2:
            await trio.sleep(0.001)
        nursery.start_soon(one, "long", 2)
    for rid, result in results.items():
        assert (
            result.output_token_ids
            == reference(model, prompts[rid], len(result.output_token_ids))[0]
        )
    kv.check_integrity()
    return engine, steps


async def test_balanced_batches_advance_every_decode_while_a_long_prompt_prefills(
    tiny: torch.nn.Module,
) -> None:
    engine, steps = await serve_decodes_beside_a_long_prompt(tiny, "workflow", slack=20)
    assert engine.scheduler.balanced_prefill
    # 400 tokens in 24-token chunks (the slack and a block's probe above it), both
    # decodes advancing in each of those steps
    assert [tokens for tokens, _, _ in steps] == [24] * 16 + [16]
    assert all(decoding == {"s0", "s1"} for _, decoding, _ in steps)
    # each chunk's full blocks are committed as it lands (the last with the prompt)
    assert [committed for _, _, committed in steps] == [24 * (i + 1) // BS for i in range(16)] + [
        100
    ]


async def test_a_slack_below_one_block_keeps_the_whole_chunk(tiny: torch.nn.Module) -> None:
    """Where a decode forward hides less than a block of prefill (a CPU), balanced chunks
    would hide nothing and only add forwards: the chunk stays whole; a slack past the
    chunk cap keeps the cap."""
    for slack in (0, BS - 1, 10_000):
        engine, steps = await serve_decodes_beside_a_long_prompt(tiny, "workflow", slack=slack)
        assert [tokens for tokens, _, _ in steps] == [128, 128, 128, 16]
        assert all(decoding == {"s0", "s1"} for _, decoding, _ in steps)
        assert engine.statistics().forwards == engine.statistics().steps


async def test_an_unmeasured_slack_keeps_the_whole_chunk(tiny: torch.nn.Module) -> None:
    """Until a step with prefill beside decodes is measured, the chunk stays whole."""
    kv, engine = make_engine(tiny, gpu=160, host=0, max_prefill_tokens=128)
    engine.scheduler = get_scheduler("workflow")
    assert engine.costs.prefill_slack_tokens() is None
    assert engine._prefill_budget(2) == 128
    engine.costs.prefill_slack_tokens = lambda: BS  # type: ignore[method-assign]
    assert engine._prefill_budget(2) == 2 * BS  # the slack and a block's probe above it
    assert engine._prefill_budget(0) == 128  # nothing decodes: nothing to stall


async def test_fcfs_keeps_its_fixed_chunk_while_requests_decode(tiny: torch.nn.Module) -> None:
    engine, steps = await serve_decodes_beside_a_long_prompt(tiny, "fcfs", slack=24)
    assert not engine.scheduler.balanced_prefill
    assert [tokens for tokens, _, _ in steps] == [128, 128, 128, 16]
    assert all(decoding == {"s0", "s1"} for _, decoding, _ in steps)
    assert [committed for _, _, committed in steps] == [0, 0, 0, 100]  # the prompt at once


@pytest.mark.parametrize("scheduler", ["fcfs", "workflow"])
async def test_the_engine_reports_its_prefill_and_decode_time(
    tiny: torch.nn.Module, scheduler: str
) -> None:
    engine, _ = await serve_decodes_beside_a_long_prompt(tiny, scheduler)  # measured slack
    stats = engine.statistics()
    assert stats.prefill_s > 0 and stats.decode_s > 0
    assert stats.copy_s + stats.prefill_s + stats.decode_s <= stats.busy_s
    assert engine.prefill_share is not None and 0 < engine.prefill_share < 1
    assert engine.costs.prefill_s_per_token > 0 and engine.costs.decode_step_s > 0


async def test_the_workflow_scheduler_reads_the_torch_engines_prefill_share(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny)
    scheduler = WorkflowScheduler()
    engine.scheduler = scheduler
    shares: list[float | None] = []
    admit = scheduler.admit

    def spy_admit(*args, **kwargs) -> None:
        shares.append(kwargs["prefill_share"])
        admit(*args, **kwargs)

    scheduler.admit = spy_admit  # type: ignore[method-assign]
    async with running(engine):
        await engine.generate(request("a", random_prompt(30, seed=63), new=8))
    unknown = shares.index(next(s for s in shares if s is not None))
    assert unknown >= 1 and set(shares[:unknown]) == {None}  # nothing measured before a step
    measured = shares[unknown:]
    assert len(measured) >= 7 and all(s is not None and 0 <= s <= 1 for s in measured)
    assert measured[0] > measured[-1]  # the prefill step first, decodes after


# -- one forward per step over the KV in the pool (issue 30, item 1) ------------------------


async def test_each_step_is_one_forward_over_its_chunks_and_decodes(
    tiny: torch.nn.Module,
) -> None:
    engine, steps = await serve_decodes_beside_a_long_prompt(tiny, "workflow", slack=24)
    forwards = engine.statistics().forwards
    assert forwards == engine.statistics().steps  # chunks and decodes together, every step
    assert all(decoding == {"s0", "s1"} for _, decoding, _ in steps)


async def test_twins_computing_the_same_blocks_read_the_trees_copy_after_commit(
    tiny: torch.nn.Module,
) -> None:
    kv, engine = make_engine(tiny, gpu=64, host=0)
    prompt = random_prompt(26, seed=70)
    results: dict[str, GenerateResult] = {}
    kept: list[list[int]] = []
    apply = engine._apply

    def recording_apply(plan) -> None:
        apply(plan)
        kept.extend(engine._blocks(e)[:6] for e in engine._running if e.prompt_committed)

    engine._apply = recording_apply  # type: ignore[method-assign]

    async def one(rid: str) -> None:
        results[rid] = await engine.generate(request(rid, prompt, new=12))

    async with running(engine), trio.open_nursery() as nursery:
        nursery.start_soon(one, "a")
        nursery.start_soon(one, "b")  # admitted in the same step: both miss
    want = reference(tiny, prompt, 12)[0]
    assert [tiers(results[r]) for r in "ab"] == [(0, 0, 26)] * 2
    assert results["a"].output_token_ids == results["b"].output_token_ids == want
    assert len({tuple(blocks) for blocks in kept}) == 1  # the second reads the first's
    kv.check_integrity()
    assert kv.tree.private_blocks("gpu") == 0


async def test_a_running_requests_kv_is_in_its_pool_blocks_only(tiny: torch.nn.Module) -> None:
    kv, engine = make_engine(tiny)
    prompt = random_prompt(18, seed=71)
    seen: list[int] = []
    checked: list[bool] = []

    def on_token(token: int) -> None:
        seen.append(token)
        if len(seen) == 4:  # decoding: prompt + 3 outputs have KV
            entry = engine._running[0]
            assert not hasattr(entry, "cache")
            sequence = list(prompt) + seen[:3]
            _, want_kv = plain_kv(tiny, sequence)
            got = engine.pools.gather(engine._blocks(entry), len(sequence))
            for (k, v), (gk, gv) in zip(want_kv, got, strict=True):
                torch.testing.assert_close(gk, k, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(gv, v, rtol=1e-5, atol=1e-5)
            checked.append(True)

    async with running(engine):
        await engine.generate(request("r", prompt, new=6, on_token=on_token))
    assert checked == [True]


def plain_kv(model: torch.nn.Module, ids: list[int]):
    with torch.inference_mode():
        out = model.model(torch.tensor([ids]), use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    return out.last_hidden_state, [(layer.keys, layer.values) for layer in cache.layers]


def test_decode_comparison_times_plain_and_engine_runs_alternately(tiny) -> None:
    from pbkv.engines.torchengine.measure import decode_comparison

    result = decode_comparison(tiny, batch=2, context_tokens=12, steps=2, repeats=2)
    assert (len(result.plain), len(result.engine)) == (3, 2)  # plain first and last
    assert all(t.wall_s > 0 and t.cpu_s > 0 for t in (*result.plain, *result.engine))
    assert result.ratio > 0 and result.cpu_ratio > 0
    with pytest.raises(ValueError, match="counts >= 1"):
        decode_comparison(tiny, batch=0)
