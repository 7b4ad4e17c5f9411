"""The torch engine's limits, its counters, and the KV manager's config for a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pbkv.engines.torchengine.model import KVLayout
from pbkv.kvmanager import KVConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True, slots=True)
class TorchEngineConfig:
    """Scheduler limits of the torch engine.

    Args:
        max_batch_size: most requests running at once (prefilling or decoding).
        max_prefill_tokens: prefill tokens per step, shared by the requests prefilling
            (chunked prefill keeps decodes moving during a long prompt); with a
            ``balanced_prefill`` scheduler, the cap on the measured stall-free budget.
        stop_token_ids: generation stops early at any of these; ``None`` = the model's
            ``eos_token_id``; ``()`` = always generate ``max_new_tokens``.
        check_integrity: assert the KV manager's invariants after every step (tests).
    """

    max_batch_size: int = 8
    max_prefill_tokens: int = 512
    stop_token_ids: tuple[int, ...] | None = None
    check_integrity: bool = False


@dataclass(frozen=True, slots=True)
class TorchStatistics:
    """Engine counters; times are wall-clock seconds.

    ``copy_s``, ``prefill_s`` and ``decode_s`` are the worker thread's time in each part
    of the steps (a forward that carries both is split as
    :meth:`~pbkv.engines.torchengine.engine.TorchEngine._note_costs`
    says); ``busy_s`` is the steps' whole time, the
    hand-off to the worker thread and back included (so the parts sum to at most it).
    ``forwards`` counts model forwards (one per step that computes; more only where a
    failed forward is run again row by row); ``decode_forwards`` those that carried
    decodes (``decode_tokens`` over it is the mean decode batch); ``h2d_blocks`` /
    ``d2h_blocks`` count blocks queued for copy.
    """

    steps: int
    prefill_tokens: int
    decode_tokens: int
    decode_forwards: int
    prefill_s: float
    decode_s: float
    copy_s: float
    h2d_blocks: int
    d2h_blocks: int
    prefetch_steps: int
    retractions: int = 0
    busy_s: float = 0.0
    forwards: int = 0


@dataclass(slots=True)
class Counters:
    """The engine's running counters (:class:`TorchStatistics` is their snapshot)."""

    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_forwards: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    copy_s: float = 0.0
    h2d_blocks: int = 0
    d2h_blocks: int = 0
    prefetch_steps: int = 0
    busy_s: float = 0.0


def make_kv_config(
    model: PreTrainedModel,
    *,
    block_size: int,
    gpu_capacity_blocks: int,
    host_capacity_blocks: int,
    policy: str = "pbkv",
    bandwidth_bytes_per_s: float = 0.0,
    horizon: int = 3,
    gamma: float = 0.8,
) -> KVConfig:
    """Return a :class:`KVConfig` whose ``bytes_per_block`` is ``model``'s (at its dtype).

    Args:
        bandwidth_bytes_per_s: host → device copy rate, for the prefetch budget.
        (others): as :class:`KVConfig`.
    """
    layout = KVLayout.of(model.config, block_size, next(model.parameters()).dtype)
    return KVConfig(
        block_size=block_size,
        gpu_capacity_blocks=gpu_capacity_blocks,
        host_capacity_blocks=host_capacity_blocks,
        bytes_per_block=layout.bytes_per_block,
        policy=policy,
        horizon=horizon,
        gamma=gamma,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
    )
