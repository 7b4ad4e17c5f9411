"""The records of the fake TensorRT-LLM block manager (:mod:`.fake`): its configuration,
one KV block, a running request's blocks, its per-request metrics and ground-truth
counters, block hashes, and the per-block retention a request asks for.

Plain synchronous code, no trio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pbkv.engines.trtllm.api import DEFAULT_PRIORITY, OFFLOAD_MIN_PRIORITY
from pbkv.engines.trtllm.blockkey import block_key_hash, cache_salt_id

GPU, HOST = 0, 1

Key = tuple[int | None, tuple[int, ...]]  # (cache salt id, tokens): a child's name


def block_hash(tokens: Sequence[int], parent_hash: int | None, cache_salt: str = "") -> int:
    """Return the engine's hash of one block under ``parent_hash`` (``None``: the root).

    The cache salt enters the first block's hash only, so every later block differs too
    (``BlockKeyHasher::hash``; see :func:`pbkv.engines.trtllm.blockkey.block_key_hash`).
    """
    return block_key_hash(tokens, parent_hash or 0, cache_salt_id(cache_salt))


@dataclass(frozen=True, slots=True)
class BlockManagerConfig:
    """Sizes and switches of the fake, named after ``KvCacheConfig`` fields.

    Args:
        tokens_per_block: page size.
        gpu_blocks / host_blocks: blocks per cache level (``host_cache_size`` in blocks).
        event_buffer_max_size: KV-event ring size; 0 disables events.
        onboard_blocks: allow host→GPU onboarding (False also stops offloading, as V1).
        secondary_offload_min_priority: fixed at 30 in 1.2's PyTorch backend.
        enable_partial_reuse / copy_on_partial_reuse: ``KvCacheConfig``'s (both on by default).
        window_size: the attention window reported in the events' envelope.
        extra_window_sizes: other attention windows of the model (VSWA); their events
            are copies of the main window's.
        late_removals: 1.2.x event order (an iteration's removes after its other events).
    """

    tokens_per_block: int = 32
    gpu_blocks: int = 1024
    host_blocks: int = 0
    event_buffer_max_size: int = 1024
    onboard_blocks: bool = True
    secondary_offload_min_priority: int = OFFLOAD_MIN_PRIORITY
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    window_size: int = 1 << 20
    extra_window_sizes: tuple[int, ...] = ()
    late_removals: bool = True

    def __post_init__(self) -> None:
        if self.tokens_per_block < 1 or self.gpu_blocks < 1 or self.host_blocks < 0:
            raise ValueError(f"bad block manager sizes: {self}")
        if self.window_size in self.extra_window_sizes:
            raise ValueError(f"extra_window_sizes repeats the main window {self.window_size}")

    @property
    def window_sizes(self) -> tuple[int, ...]:
        """Every window, ascending (the order the engine's managers emit in)."""
        return tuple(sorted({self.window_size, *self.extra_window_sizes}))


@dataclass(eq=False, slots=True)
class Block:
    """One KV block: in the radix tree once stored, else private to its sequence."""

    block_id: int
    tokens: tuple[int, ...] = ()
    salt: int | None = None
    hash: int = 0
    parent: Block | None = None
    children: dict[Key, Block] = field(default_factory=dict)
    in_tree: bool = False
    level: int = GPU
    priority: int = DEFAULT_PRIORITY
    duration_s: float | None = None
    expiry_s: float | None = None
    ref_count: int = 0
    release_seq: int = 0
    level_children: list[int] = field(default_factory=lambda: [0, 0])

    @property
    def key(self) -> Key:
        return (self.salt, self.tokens)

    @property
    def free(self) -> bool:
        """In the tree with no reference: sits in a free queue."""
        return self.in_tree and self.ref_count == 0

    @property
    def leaf(self) -> bool:
        """No child at this block's own cache level (eviction takes leaves only)."""
        return self.level_children[self.level] == 0


@dataclass(frozen=True, slots=True)
class KvCacheMetrics:
    """``request_perf_metrics.kv_cache_metrics`` of one request (upstream field names),
    summed over attention windows as upstream sums them."""

    num_total_allocated_blocks: int
    num_new_allocated_blocks: int
    num_reused_blocks: int
    num_missed_blocks: int
    kv_cache_hit_rate: float


@dataclass(eq=False, slots=True)
class GenerationSequence:
    """A running request's blocks (``GenerationRequest`` upstream).

    ``cached_tokens`` is the prompt tokens matched at admission, partial matches
    included (``prepopulatedPromptLen``).
    """

    request_id: int
    tokens: list[int]
    prompt_tokens: int
    salt: int | None
    blocks: list[Block]
    decode_priority: int
    decode_duration_s: float | None
    metrics: KvCacheMetrics
    cached_tokens: int
    onboarded_blocks: int
    reserved_blocks: int


@dataclass(slots=True)
class FakeCounters:
    """Ground truth the real engine does not report (for the bench and tests)."""

    reused_gpu_blocks: int = 0
    onboarded_blocks: int = 0
    missed_blocks: int = 0
    partial_reused_blocks: int = 0
    offloaded_blocks: int = 0
    dropped_blocks: int = 0
    host_evicted_blocks: int = 0
    events_dropped: int = 0


def per_block_retention(
    retention: Any, tokens_per_block: int, num_blocks: int
) -> list[tuple[int | None, float | None]]:
    """Return ``(priority, duration_s)`` per prompt block: the range holding the block's
    first token, ``(None, None)`` where no range does
    (``kvCacheRetentionConfig.cpp::getPerBlockRetentionPriorityDuration``)."""
    ranges = list(getattr(retention, "token_range_retention_configs", None) or [])
    out: list[tuple[int | None, float | None]] = []
    for i in range(num_blocks):
        first = i * tokens_per_block
        hit = next(
            (
                r
                for r in ranges
                if r.token_start <= first and (r.token_end is None or first < r.token_end)
            ),
            None,
        )
        out.append((None, None) if hit is None else (hit.priority, seconds(hit.duration_ms)))
    return out


def seconds(duration: Any) -> float | None:
    """Return a retention duration in seconds: a ``timedelta``, or milliseconds as upstream
    takes them (``None``: no duration)."""
    if duration is None:
        return None
    return (
        duration.total_seconds() if hasattr(duration, "total_seconds") else float(duration) / 1000
    )
