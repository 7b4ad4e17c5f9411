"""Paged KV block pools on the device and the host, addressed by the radix tree's block ids.

The KV manager's tree allocates; this module only holds the tensors and moves blocks:
gathering a cached prefix into a model's past KV, storing computed KV into blocks, and
copying blocks between tiers in the order they were queued. On CUDA the host pool is
pinned and copies run on a side stream, so reloads and prefetches overlap compute;
completion is observed through a CUDA event. On CPU the "device" is CPU memory too and
copies are synchronous.

Shapes:
    device pool: ``(gpu_blocks, layers, 2, kv_heads, block_size, head_dim)``
    host pool: ``(host_blocks, layers, 2, kv_heads, block_size, head_dim)``
    per-layer KV of a sequence: ``(1, kv_heads, tokens, head_dim)`` (transformers' cache)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from pbkv.engines.torchengine.model import KVLayout


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """One queued copy between tiers.

    Args:
        to_host: device → host (a demotion) when true, host → device (a load) otherwise.
        src_blocks / dst_blocks: block ids in the source and destination pools, paired
            in order.
    """

    to_host: bool
    src_blocks: tuple[int, ...]
    dst_blocks: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.src_blocks)


class CopyDone:
    """Completion of a batch of copies: a CUDA event, or nothing on CPU (already done)."""

    __slots__ = ("_event",)

    def __init__(self, event: torch.cuda.Event | None) -> None:
        self._event = event

    def ready(self) -> bool:
        """Return whether every copy of the batch has landed. Does not block."""
        return self._event is None or bool(self._event.query())

    def wait(self) -> None:
        """Block until every copy of the batch has landed."""
        if self._event is not None:
            self._event.synchronize()


class PagedKVPools:
    """The device and host KV pools of one engine.

    Args:
        layout: per-token KV shape, block size and dtype.
        gpu_blocks / host_blocks: pool sizes (the KV manager's tier capacities).
        device: where the device pool lives; the host pool is CPU memory, pinned when
            ``device`` is CUDA.
    """

    def __init__(
        self, layout: KVLayout, gpu_blocks: int, host_blocks: int, device: torch.device
    ) -> None:
        self.layout = layout
        self.device = device
        block = layout.block_shape()
        self.gpu = torch.zeros((gpu_blocks, *block), dtype=layout.dtype, device=device)
        pin = device.type == "cuda"
        self.host = torch.zeros((host_blocks, *block), dtype=layout.dtype, pin_memory=pin)
        self._copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    # -- model-facing ----------------------------------------------------------------

    def gather(
        self, block_ids: Sequence[int], tokens: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Return the first ``tokens`` tokens of ``block_ids`` as per-layer ``(keys, values)``.

        Does not modify the pools (the result is a copy).

        Shapes:
            each tensor: ``(1, kv_heads, tokens, head_dim)``.

        Raises:
            ValueError: the blocks hold fewer than ``tokens`` tokens.
        """
        lay = self.layout
        if tokens > len(block_ids) * lay.block_size:
            raise ValueError(f"{len(block_ids)} blocks cannot hold {tokens} tokens")
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        blocks = self.gpu.index_select(0, idx)  # (n, L, 2, H, bs, D)
        seq = blocks.permute(1, 2, 3, 0, 4, 5).reshape(
            lay.layers, 2, lay.kv_heads, len(block_ids) * lay.block_size, lay.head_dim
        )[:, :, :, :tokens]
        return [(seq[i, 0].unsqueeze(0), seq[i, 1].unsqueeze(0)) for i in range(lay.layers)]

    def store(
        self,
        block_ids: Sequence[int],
        layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        start_token: int,
    ) -> None:
        """Write tokens ``[start_token, start_token + len(block_ids) · block_size)`` of a
        sequence's per-layer KV into ``block_ids`` of the device pool.

        Mutates: the device pool's ``block_ids``.

        Shapes:
            ``layers_kv[i]``: ``(1, kv_heads, >= end token, head_dim)`` each.
        """
        if not block_ids:
            return
        lay = self.layout
        n = len(block_ids)
        end = start_token + n * lay.block_size
        keys = torch.stack([k[0, :, start_token:end] for k, _ in layers_kv])
        values = torch.stack([v[0, :, start_token:end] for _, v in layers_kv])
        seq = torch.stack([keys, values], dim=1)  # (L, 2, H, n·bs, D)
        blocks = seq.reshape(lay.layers, 2, lay.kv_heads, n, lay.block_size, lay.head_dim)
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        self.gpu.index_copy_(0, idx, blocks.permute(3, 0, 1, 2, 4, 5).to(self.gpu.dtype))

    # -- tier copies -------------------------------------------------------------------

    def copy(self, copies: Sequence[BlockCopy]) -> CopyDone:
        """Run ``copies`` in queue order.

        On CUDA they are issued on the side stream after the work already queued on the
        compute stream; the compute stream then waits only for the demotions (whose GPU
        blocks may be reused at once), so loads overlap the compute that follows.

        Mutates: destination blocks of both pools.

        Returns:
            When the whole batch has landed.
        """
        stream = self._copy_stream
        if stream is None:
            for c in copies:
                self._copy_one(c, non_blocking=False)
            return CopyDone(None)
        compute = torch.cuda.current_stream(self.device)
        stream.wait_stream(compute)
        last_demotion = max((i for i, c in enumerate(copies) if c.to_host), default=-1)
        with torch.cuda.stream(stream):
            for i, c in enumerate(copies):
                self._copy_one(c, non_blocking=True)
                if i == last_demotion:
                    compute.wait_event(_recorded(stream))
            return CopyDone(_recorded(stream))

    def synchronize(self) -> None:
        """Block until every copy issued so far has landed (a no-op on CPU).

        Call before handing the destination blocks of copies that may still be in
        flight back to an allocator: a late copy would write into reused blocks.
        """
        if self._copy_stream is not None:
            self._copy_stream.synchronize()

    def _copy_one(self, c: BlockCopy, *, non_blocking: bool) -> None:
        src, dst = (self.gpu, self.host) if c.to_host else (self.host, self.gpu)
        for s, d, n in _runs(c.src_blocks, c.dst_blocks):
            dst[d : d + n].copy_(src[s : s + n], non_blocking=non_blocking)


def _recorded(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(stream)
    return event


class _Run(NamedTuple):
    src: int
    dst: int
    length: int


def _runs(src: Sequence[int], dst: Sequence[int]) -> list[_Run]:
    """Pair ``src`` and ``dst`` ids into runs consecutive on both sides (one copy each)."""
    runs: list[_Run] = []
    for s, d in zip(src, dst, strict=True):
        last = runs[-1] if runs else None
        if last is not None and last.src + last.length == s and last.dst + last.length == d:
            runs[-1] = last._replace(length=last.length + 1)
        else:
            runs.append(_Run(s, d, 1))
    return runs
