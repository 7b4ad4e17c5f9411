"""What the torch engine's work really costs on this machine: prefill, reload, a hit,
and batched decode beside plain transformers'.

Wall-clock micro-measurements (``time.perf_counter`` and the real trio clock) for the
issue's numbers, ``pbkv calibrate`` and ``scripts/gpu_check.py``; nothing here runs in
virtual time.
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

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


class StepTimes(NamedTuple):
    """Mean wall-clock and process CPU seconds of one decode step in a run."""

    wall_s: float
    cpu_s: float


@dataclass(frozen=True, slots=True)
class DecodeComparison:
    """Batched decode steps of the engine and of plain transformers, measured side by
    side on the same model, threads and prompts, runs alternated (plain first and last).

    Attributes:
        batch: sequences decoding together.
        context_tokens: each sequence's prompt length.
        steps: decode steps timed per run.
        threads: torch's intra-op threads.
        plain: each plain transformers run (a batched ``DynamicCache``).
        engine: each engine run, from the first token to the last (its scheduling,
            thread hand-off and sampling included). The first prefills the prompts
            (each sequence's KV is one run of blocks); the later ones hit them, so each
            sequence reads its prefix from the tree's blocks and writes after it.
    """

    batch: int
    context_tokens: int
    steps: int
    threads: int
    plain: tuple[StepTimes, ...]
    engine: tuple[StepTimes, ...]

    @property
    def plain_step_s(self) -> float:
        """Plain transformers' wall seconds a step (median of the runs)."""
        return _median(self.plain, 0)

    @property
    def engine_step_s(self) -> float:
        """The engine's wall seconds a step (median of the runs)."""
        return _median(self.engine, 0)

    @property
    def ratio(self) -> float:
        """Engine over plain wall time per token (medians of the runs)."""
        return self.engine_step_s / self.plain_step_s

    @property
    def cpu_ratio(self) -> float:
        """Engine over plain process CPU time per token (medians of the runs)."""
        return _median(self.engine, 1) / _median(self.plain, 1)


def _median(runs: Sequence[StepTimes], field: int) -> float:
    return statistics.median(r[field] for r in runs)


def decode_comparison(
    model: PreTrainedModel,
    batch: int = 8,
    context_tokens: int = 512,
    steps: int = 16,
    repeats: int = 3,
) -> DecodeComparison:
    """Time greedy decode of ``batch`` random prompts of ``context_tokens`` tokens,
    ``steps`` steps a run: plain transformers, then the engine, ``repeats`` times, and
    plain once more.

    Raises:
        ValueError: a count below 1.
    """
    if min(batch, context_tokens, steps, repeats) < 1:
        raise ValueError(
            f"need counts >= 1, got batch={batch} context_tokens={context_tokens} "
            f"steps={steps} repeats={repeats}"
        )
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (batch, context_tokens), device=device)
    prompts = [tuple(row) for row in ids.tolist()]
    plain: list[StepTimes] = []
    served: list[StepTimes] = []

    async def main() -> None:
        engine = _decode_engine(model, batch, context_tokens + steps + 1)
        with torch.inference_mode():
            out = model(ids, use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            for run in range(repeats):
                plain.append(_plain_decode(model, cache, ids[:, -1:], steps))
                served.append(await _engine_decode(engine, prompts, steps, run))
            plain.append(_plain_decode(model, cache, ids[:, -1:], steps))
            nursery.cancel_scope.cancel()

    trio.run(main)
    threads = torch.get_num_threads()
    return DecodeComparison(batch, context_tokens, steps, threads, tuple(plain), tuple(served))


def _plain_decode(
    model: PreTrainedModel, cache: object, tokens: torch.Tensor, steps: int
) -> StepTimes:
    """Time ``steps`` greedy steps extending ``cache`` (cropped back after)."""
    device = tokens.device
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    _sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(tokens, use_cache=True, **{kwarg: cache}).logits[:, -1]
            tokens = torch.tensor([[t] for t in logits.argmax(-1).tolist()], device=device)
    times = StepTimes((time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps)
    cache.crop(-steps)  # type: ignore[attr-defined]
    return times


def _decode_engine(model: PreTrainedModel, batch: int, tokens: int) -> TorchEngine:
    """An engine whose GPU tier holds ``batch`` sequences of ``tokens`` twice over (the
    cached ones and a run's own), prefilling every prompt in its first step."""
    block_size = 16
    blocks = 2 * batch * -(-tokens // block_size)
    kv_config = make_kv_config(
        model, block_size=block_size, gpu_capacity_blocks=blocks, host_capacity_blocks=0
    )
    config = TorchEngineConfig(
        max_batch_size=batch, max_prefill_tokens=batch * tokens, stop_token_ids=()
    )
    return TorchEngine(KVManager(kv_config, trio.current_time), model, config)


async def _engine_decode(
    engine: TorchEngine, prompts: list[tuple[int, ...]], steps: int, run: int
) -> StepTimes:
    """Serve ``prompts`` at once for ``steps + 1`` tokens each; time the steps after the
    first token (marked by the first request's tokens)."""
    marks: list[tuple[float, float]] = []

    def mark(token: int) -> None:
        marks.append((time.perf_counter(), time.process_time()))

    async with trio.open_nursery() as callers:
        for i, prompt in enumerate(prompts):
            request = GenerateRequest(
                f"{run}/{i}", None, "probe", prompt, steps + 1, on_token=mark if i == 0 else None
            )
            callers.start_soon(engine.generate, request)
    (wall0, cpu0), (wall1, cpu1) = marks[0], marks[-1]
    return StepTimes((wall1 - wall0) / steps, (cpu1 - cpu0) / steps)
