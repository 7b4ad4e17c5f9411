"""Paged KV block pools on the device and the host, addressed by the radix tree's block ids.

The KV manager's tree allocates; this module only holds the tensors and moves blocks:
handing the model each layer's keys and values as one flat view (the forward reads and
writes them in place, :mod:`~pbkv.engines.torchengine.forward`), and copying blocks
between tiers in the order they were queued. On CUDA the host pool is
pinned and copies run on a side stream, so reloads and prefetches overlap compute;
completion is observed through a CUDA event. On CPU the "device" is CPU memory too and
copies are synchronous.

Shapes:
    device pool: ``(layers, 2, gpu_blocks, block_size, kv_heads, head_dim)``
    host pool: ``(layers, 2, host_blocks, block_size, kv_heads, head_dim)``
    one layer's keys (or values): ``(blocks · block_size, kv_heads, head_dim)``; token
    ``t`` of a block ``b`` is slot ``b · block_size + t``
"""

from __future__ import annotations

import os
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

    Raises:
        ValueError: the pools would not fit this machine's memory (physical memory for
            the host pool, and for the device pool on CPU; free device memory on CUDA).
    """

    def __init__(
        self, layout: KVLayout, gpu_blocks: int, host_blocks: int, device: torch.device
    ) -> None:
        _check_fits_memory(layout, gpu_blocks, host_blocks, device)
        self.layout = layout
        self.device = device
        self.gpu = torch.zeros(layout.pool_shape(gpu_blocks), dtype=layout.dtype, device=device)
        pin = device.type == "cuda"
        self.host = torch.zeros(layout.pool_shape(host_blocks), dtype=layout.dtype, pin_memory=pin)
        self._copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    # -- model-facing ----------------------------------------------------------------

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return layer ``layer``'s keys and values of the device pool, as views.

        Writing into them writes the pool.

        Shapes:
            each: ``(gpu_blocks · block_size, kv_heads, head_dim)``.
        """
        lay = self.layout
        flat = (-1, lay.kv_heads, lay.head_dim)
        return self.gpu[layer, 0].view(flat), self.gpu[layer, 1].view(flat)

    def gather(
        self, block_ids: Sequence[int], tokens: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Return the first ``tokens`` tokens of ``block_ids`` as per-layer ``(keys, values)``.

        Does not modify the pools (the result is a copy).

        Shapes:
            each tensor: ``(1, kv_heads, tokens, head_dim)`` (transformers' cache layout).

        Raises:
            ValueError: the blocks hold fewer than ``tokens`` tokens.
        """
        lay = self.layout
        if tokens > len(block_ids) * lay.block_size:
            raise ValueError(f"{len(block_ids)} blocks cannot hold {tokens} tokens")
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        blocks = self.gpu.index_select(2, idx)  # (L, 2, n, bs, H, D)
        seq = blocks.flatten(2, 3)[:, :, :tokens].permute(0, 1, 3, 2, 4)  # (L, 2, H, T, D)
        return [(seq[i, 0].unsqueeze(0), seq[i, 1].unsqueeze(0)) for i in range(lay.layers)]

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
        src, dst = src.flatten(0, 1), dst.flatten(0, 1)  # (layers · 2, blocks, ...)
        for s, d, n in _runs(c.src_blocks, c.dst_blocks):
            if non_blocking:  # across devices: contiguous pieces only, one per layer's K or V
                for part in range(src.shape[0]):
                    dst[part, d : d + n].copy_(src[part, s : s + n], non_blocking=True)
            else:
                dst[:, d : d + n].copy_(src[:, s : s + n])


def _check_fits_memory(
    layout: KVLayout, gpu_blocks: int, host_blocks: int, device: torch.device
) -> None:
    """Refuse pools this machine cannot hold, before allocating anything."""
    gib = 2**30
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    in_ram = host_blocks + (gpu_blocks if device.type == "cpu" else 0)
    if in_ram * layout.bytes_per_block > ram:
        raise ValueError(
            f"KV pools of {in_ram:,} blocks in CPU memory need "
            f"{in_ram * layout.bytes_per_block / gib:,.1f} GiB; this machine has "
            f"{ram / gib:,.1f} GiB"
        )
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        if gpu_blocks * layout.bytes_per_block > free_bytes:
            raise ValueError(
                f"a device KV pool of {gpu_blocks:,} blocks needs "
                f"{gpu_blocks * layout.bytes_per_block / gib:,.1f} GiB; {device} has "
                f"{free_bytes / gib:,.1f} GiB free"
            )


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
