"""Cache statistics: what the KV manager did, in tokens, blocks and bytes (§9)."""

from __future__ import annotations

import msgspec


class KVStatistics(msgspec.Struct, frozen=True):
    """A snapshot of one KV manager's counters.

    Token counts are over admitted prompts; ``gpu_hit_rate`` = cached GPU tokens /
    prompt tokens, ``host_hit_rate`` = cached host tokens / prompt tokens. A retracted
    request's re-admission (its prompt plus the tokens it had generated, see
    ``AdmitRequest.resumed``) is not a new request: it counts only in
    ``resumed_admissions`` and ``resumed_computed_tokens`` (what it prefilled again).
    """

    policy: str
    requests: int
    prompt_tokens: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    computed_tokens: int
    evicted_retired_blocks: int
    evicted_active_blocks: int
    demoted_blocks: int
    dropped_blocks: int
    h2d_bytes: int
    d2h_bytes: int
    prefetch_issued_blocks: int
    prefetch_used_blocks: int
    prefetch_wasted_blocks: int
    rejected_admissions: int
    score_refreshed_nodes: int
    rejected_forecasts: int = 0
    resumed_admissions: int = 0
    resumed_computed_tokens: int = 0

    @property
    def gpu_hit_rate(self) -> float:
        return self.cached_gpu_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def total_hit_rate(self) -> float:
        """Prompt tokens served from either tier over prompt tokens."""
        cached = self.cached_gpu_tokens + self.cached_host_tokens
        return cached / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def host_hit_rate(self) -> float:
        return self.cached_host_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
