"""The torch engine under the write-through host tier (issue 34): every stored block is
copied to the host pool as it is stored, and a GPU eviction keeps that copy, so a reload
reads the copy made at store time; tokens and logits equal a recompute's."""

import dataclasses

import pytest
import torch
import trio

from pbkv.engines.torchengine.engine import TorchEngine, TorchEngineConfig, make_kv_config
from pbkv.engines.torchengine.model import load_model
from pbkv.kvmanager import KVManager

from .test_torch_engine import (
    BS,
    logits_of,
    random_prompt,
    reference,
    request,
    running,
    tiers,
)


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return load_model("tiny", device="cpu")


@pytest.mark.parametrize("prompt_tokens", [37, 36])
async def test_write_through_reload_gives_the_recomputed_tokens_and_logits(
    tiny: torch.nn.Module, prompt_tokens: int
) -> None:
    config = make_kv_config(
        tiny, block_size=BS, gpu_capacity_blocks=64, host_capacity_blocks=128, policy="lru"
    )
    kv = KVManager(dataclasses.replace(config, host_tier="write-through"), trio.current_time)
    engine = TorchEngine(kv, tiny, TorchEngineConfig(stop_token_ids=(), check_integrity=True))
    prompt = random_prompt(prompt_tokens, seed=prompt_tokens)
    want_tokens, want_logits = reference(tiny, prompt, 6)
    cached = prompt_tokens // BS * BS
    async with running(engine):
        miss = await engine.generate(request("miss", prompt))
        copies_at_store = engine.statistics().d2h_blocks
        kv.tree.evict("gpu", kv.config.gpu_capacity_blocks)  # keeps the host copies
        reload = await engine.generate(request("reload", prompt))
    assert copies_at_store == (prompt_tokens + 5) // BS  # written through as stored
    assert tiers(reload) == (0, cached, prompt_tokens - cached)
    for result in (miss, reload):
        assert result.output_token_ids == want_tokens
        torch.testing.assert_close(logits_of(tiny, result), want_logits, rtol=1e-4, atol=1e-4)
    kv.check_integrity()
