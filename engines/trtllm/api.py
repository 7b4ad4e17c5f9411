"""Local stand-ins for the TensorRT-LLM 1.2 request API the adapter speaks.

They mirror the constructor signatures of ``tensorrt_llm.SamplingParams`` and
``tensorrt_llm.llmapi.KvCacheRetentionConfig`` (nanobind
``cpp/tensorrt_llm/nanobind/executor/request.cpp``), so the adapter builds either these
or the real classes with the same calls (:func:`load_api`). The fake block manager and
the virtual-time ``SimLLM`` accept both, reading them by attribute.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

#: ``kDefaultRetentionPriority``: blocks without an explicit priority.
DEFAULT_PRIORITY = 35
#: ``kDefaultSecondaryOffloadMinPriority``: GPU-evicted blocks at or above it go to host.
OFFLOAD_MIN_PRIORITY = 30
MIN_PRIORITY = 0
MAX_PRIORITY = 100


@dataclass(frozen=True, slots=True)
class TokenRangeRetentionConfig:
    """Priority (and how long it holds) for prompt tokens ``[token_start, token_end)``.

    ``token_end=None`` runs to the end of the prompt; ``duration_ms=None`` never lapses.

    Raises:
        ValueError: a priority outside 0..100, or an empty or negative range.
    """

    token_start: int
    token_end: int | None
    priority: int
    duration_ms: timedelta | None = None

    def __post_init__(self) -> None:
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be in 0..100, got {self.priority}")
        if self.token_start < 0 or (
            self.token_end is not None and self.token_end <= self.token_start
        ):
            raise ValueError(f"bad token range [{self.token_start}, {self.token_end})")


class KvCacheRetentionConfig:
    """Per-request retention: token ranges of the prompt, and the decode blocks' priority.

    Mirrors the upstream constructor: ranges sorted and non-overlapping, only the last
    may have ``token_end=None`` (upstream raises ``invalid_argument``; here ``ValueError``).
    """

    TokenRangeRetentionConfig = TokenRangeRetentionConfig

    def __init__(
        self,
        token_range_retention_configs: list[TokenRangeRetentionConfig],
        decode_retention_priority: int = DEFAULT_PRIORITY,
        decode_duration_ms: timedelta | None = None,
    ) -> None:
        ranges = list(token_range_retention_configs)
        for i, (a, b) in enumerate(zip(ranges, ranges[1:], strict=False)):
            if a.token_end is None or b.token_start < a.token_end:
                raise ValueError(f"token ranges {i} and {i + 1} overlap or are unsorted")
        if not MIN_PRIORITY <= decode_retention_priority <= MAX_PRIORITY:
            raise ValueError(f"decode priority must be in 0..100, got {decode_retention_priority}")
        self.token_range_retention_configs = ranges
        self.decode_retention_priority = decode_retention_priority
        self.decode_duration_ms = decode_duration_ms

    def __repr__(self) -> str:
        spans = ", ".join(
            f"[{r.token_start},{r.token_end})={r.priority}"
            for r in self.token_range_retention_configs
        )
        return f"KvCacheRetentionConfig({spans}; decode={self.decode_retention_priority})"


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """The ``SamplingParams`` fields the adapter sets (``tensorrt_llm/sampling_params.py``;
    keyword-only there too, with many more fields). ``None`` leaves the engine's default."""

    max_tokens: int = 32
    return_perf_metrics: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


def sampling_arguments(sampling: Any) -> dict[str, Any]:
    """Map pbkv's :class:`~pbkv.engines.base.Sampling` to ``SamplingParams`` keywords.

    Greedy is ``top_k=1`` (upstream's ``None`` fields leave the C++ runtime's defaults);
    otherwise ``temperature``, ``top_p`` and ``seed`` (a 64-bit unsigned seed upstream:
    a negative one is taken modulo 2**64).
    """
    if sampling is None or sampling.greedy:
        return {"top_k": 1}
    out: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    if sampling.seed is not None:
        out["seed"] = sampling.seed % (1 << 64)
    return out


@dataclass(frozen=True, slots=True)
class Api:
    """The classes the adapter builds requests with: these stand-ins or the real ones."""

    SamplingParams: Any
    KvCacheRetentionConfig: Any
    real: bool


LOCAL_API = Api(SamplingParams, KvCacheRetentionConfig, real=False)


def load_api(real: bool) -> Api:
    """Return the request classes: ``tensorrt_llm``'s when ``real``, else the stand-ins.

    Raises:
        ImportError: ``real`` and ``tensorrt_llm`` cannot be imported (it needs a CUDA
            driver and NVIDIA's wheel; PyPI carries only a placeholder).
    """
    if not real:
        return LOCAL_API
    trtllm = importlib.import_module("tensorrt_llm")
    llmapi = importlib.import_module("tensorrt_llm.llmapi")
    return Api(trtllm.SamplingParams, llmapi.KvCacheRetentionConfig, real=True)


def to_timedelta(seconds: float | None) -> timedelta | None:
    """Return ``seconds`` as the ``timedelta`` the retention API takes (``None`` stays)."""
    return None if seconds is None else timedelta(seconds=seconds)
