"""What the torch engine's work really costs on this machine: prefill, reload, and a hit.

Wall-clock micro-measurements (``time.perf_counter`` and the real trio clock) for the
issue's numbers and ``scripts/gpu_check.py``; nothing here runs in virtual time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import trio

from pbkv.engines.base import GenerateRequest
from pbkv.engines.torchengine.engine import TorchEngine, TorchEngineConfig, make_kv_config
from pbkv.engines.torchengine.model import KVLayout
from pbkv.engines.torchengine.pool import BlockCopy, PagedKVPools
from pbkv.kvmanager import KVManager

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True, slots=True)
class HitSaving:
    """Time to first token of one prompt with nothing cached, a GPU hit and a host hit.

    Attributes:
        prompt_tokens: prompt length.
        miss_s / gpu_hit_s / host_hit_s: median submit-to-first-token seconds.
    """

    prompt_tokens: int
    miss_s: float
    gpu_hit_s: float
    host_hit_s: float

    @property
    def gpu_hit_saves_s_per_1k_tokens(self) -> float:
        return (self.miss_s - self.gpu_hit_s) * 1000 / self.prompt_tokens

    @property
    def host_hit_saves_s_per_1k_tokens(self) -> float:
        return (self.miss_s - self.host_hit_s) * 1000 / self.prompt_tokens


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefill_tokens_per_s(model: PreTrainedModel, tokens: int = 512, repeats: int = 3) -> float:
    """Measure uncached prefill of ``tokens`` random tokens (median of ``repeats``), tokens/s."""
    device = next(model.parameters()).device
    ids = torch.randint(0, int(model.config.vocab_size), (1, tokens), device=device)
    times = []
    with torch.inference_mode():
        model(ids[:, :16])  # warm-up
        for _ in range(repeats):
            _sync(device)
            started = time.perf_counter()
            model(ids, logits_to_keep=1)
            _sync(device)
            times.append(time.perf_counter() - started)
    return tokens / statistics.median(times)


def reload_bytes_per_s(
    model: PreTrainedModel, block_size: int, num_blocks: int = 64, repeats: int = 5
) -> float:
    """Measure host → device copies of ``num_blocks`` KV blocks of ``model``, bytes/s."""
    weight = next(model.parameters())
    layout = KVLayout.of(model.config, block_size, weight.dtype)
    pools = PagedKVPools(layout, num_blocks, num_blocks, weight.device)
    copy = BlockCopy(False, tuple(range(num_blocks)), tuple(range(num_blocks)))
    pools.copy([copy])
    _sync(weight.device)
    started = time.perf_counter()
    for _ in range(repeats):
        pools.copy([copy])
    _sync(weight.device)
    elapsed = time.perf_counter() - started
    return repeats * num_blocks * layout.bytes_per_block / elapsed


def hit_saving(
    model: PreTrainedModel, prompt_tokens: int = 1024, block_size: int = 16, repeats: int = 3
) -> HitSaving:
    """Serve one prompt three ways through a :class:`TorchEngine`, ``repeats`` times.

    Each round uses a fresh random prompt: first with nothing cached, then again (a GPU
    hit), then after demoting every GPU block to the host (a host hit, reloaded).
    """
    blocks = 2 * (prompt_tokens // block_size + 2)
    kv_config = make_kv_config(
        model, block_size=block_size, gpu_capacity_blocks=blocks, host_capacity_blocks=blocks
    )
    rng = np.random.default_rng(0)
    vocab = int(model.config.vocab_size)
    ttfts: dict[str, list[float]] = {"miss": [], "gpu": [], "host": []}

    async def main() -> None:
        kv = KVManager(kv_config, trio.current_time)
        engine = TorchEngine(kv, model, TorchEngineConfig(stop_token_ids=()))
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            for r in range(repeats):
                prompt = tuple(int(t) for t in rng.integers(0, vocab, prompt_tokens))
                for case in ("miss", "gpu", "host"):
                    if case == "host":
                        kv.tree.evict("gpu", blocks)
                    request = GenerateRequest(f"{r}/{case}", None, "probe", prompt, 1)
                    ttfts[case].append((await engine.generate(request)).ttft_s)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return HitSaving(prompt_tokens, *(statistics.median(ttfts[c]) for c in ("miss", "gpu", "host")))
