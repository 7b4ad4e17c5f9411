"""Roofline cost model of one tensor-parallel model replica (DESIGN §7.1).

Every time is the roofline of a hardware profile and a model profile, scaled by the profile's
efficiency factors; nothing is fitted to measurements. Symbols used below:

- ``P`` parameters, ``L`` layers, ``H`` query heads, ``H_kv`` KV heads, ``d`` head_dim,
  ``b`` dtype bytes, ``tp`` GPUs per replica;
- ``F`` = ``peak_flops_per_s · compute_efficiency`` and ``B`` = ``memory_bandwidth_bytes_per_s ·
  bandwidth_efficiency``, both per GPU.

Formulas:

- KV bytes per token = ``2 · L · H_kv · d · b`` (K and V); each GPU holds ``H_kv / tp`` heads of
  every token, so a GPU stores ``1 / tp`` of each token and the replica's token capacity is
  ``(memory − weights / tp − reserve) / (kv bytes per token / tp)`` for one GPU (all are alike).
- Prefill of ``n`` new tokens over ``m`` cached: ``2·P·n`` matmul FLOPs plus causal attention
  ``4·L·H·d·(n·m + n·(n+1)/2)`` ≈ ``4·L·H·d·n·(m + n/2)`` (QKᵀ and PV, ``2·d`` FLOPs each per
  query–key pair; query ``i`` of the chunk sees ``m + i + 1`` keys).
- Decode of a batch of ``β`` sequences attending ``k`` context tokens in total: ``2·P·β`` plus
  ``4·L·H·d·k`` FLOPs.
- Memory traffic per GPU in one step: the weights once, ``P·b / tp``, plus the KV touched,
  ``(Σ(m + n) + k) · kv bytes per token / tp``.
- A step (continuous batching: prefill chunks and a decode batch share one forward pass) takes
  ``max(total FLOPs / (tp · F), bytes per GPU / B)``: compute and memory overlap perfectly, and the
  weights are read once for the whole batch.
- A hardware profile may refine that roofline (its defaults leave it as is): with ``c`` and
  ``m`` a step's compute and memory seconds, a step takes
  ``max(c, m) + (1 − overlap) · min(c, m) + step_overhead_s + sequences · sequence_overhead_s``,
  where ``overlap`` is the share of the shorter hidden under the longer (1 on a GPU; a CPU
  runs much of them one after the other) and the overheads are what every forward and every
  sequence in it cost beyond the roofline (launches, per-sequence attention calls), as
  ``pbkv calibrate`` measures them on the torch engine.
- Host↔device copy of ``x`` bytes (all GPUs together) takes ``x / (tp · host_link_bytes_per_s)``:
  each GPU moves its own ``1 / tp`` shard over its own link.

The PBKV paper (arXiv 2605.06472) quotes a 12.34 ms decode step for Qwen3-32B on two RTX A6000.
That does not fit this testbed's roofline: reading the 32.8 GB of weights each GPU holds takes
≈ 43 ms at the full 768 GB/s, so the profiles follow the roofline and the paper's figure is only
cited here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .profile import HardwareProfile, ModelProfile

__all__ = ["CostModel", "DecodeRun", "PrefillChunk", "StepCost"]


class _Terms(NamedTuple):
    """:meth:`CostModel.step_cost`'s constant factors: ``2·P``, ``4·L·H·d``, the weight
    and per-token KV bytes of one GPU, the achieved rates ``tp·F`` and ``B``, and the
    profile's refinements of the roofline (``refined``: any differs from the roofline)."""

    matmul_flops_per_token: float
    attention_flops_per_pair: float
    weight_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    compute_flops_per_s: float
    memory_bandwidth_bytes_per_s_per_gpu: float
    step_overhead_s: float = 0.0
    sequence_overhead_s: float = 0.0
    overlap: float = 1.0
    refined: bool = False


class PrefillChunk(NamedTuple):
    """One sequence's prefill work in a step: ``new_tokens`` computed over ``cached_tokens``."""

    new_tokens: int
    cached_tokens: int


class DecodeRun(NamedTuple):
    """A run of decode steps of one sequence alone: their total seconds and FLOPs."""

    seconds: float
    flops: float


@dataclass(frozen=True)
class StepCost:
    """The roofline of one forward step.

    Args:
        flops: floating-point operations of the whole replica (all GPUs together).
        bytes_per_gpu: device-memory bytes one GPU reads or writes.
        compute_s: ``flops`` at the replica's achieved compute rate.
        memory_s: ``bytes_per_gpu`` at one GPU's achieved memory bandwidth.
        overhead_s: the step's and its sequences' overheads beyond the roofline.
        overlap: share of the shorter of ``compute_s`` and ``memory_s`` hidden under the
            longer.
    """

    flops: float
    bytes_per_gpu: float
    compute_s: float
    memory_s: float
    overhead_s: float = 0.0
    overlap: float = 1.0

    @property
    def step_s(self) -> float:
        """Return the step time: ``max(compute_s, memory_s)`` (perfect overlap), plus the
        part of the shorter not hidden and the overheads (module docstring)."""
        return _combined(self.compute_s, self.memory_s, self.overhead_s, self.overlap)


@dataclass(frozen=True)
class CostModel:
    """Roofline times and capacities of ``model`` served on ``hardware`` (see module docstring).

    Pure arithmetic: no state, no clock.

    Args:
        hardware: the node; its figures are per GPU and ``hardware.tp`` GPUs hold one replica.
        model: the served model.
        dtype_bytes: bytes per weight and per KV element (2 for bf16).

    Raises:
        ValueError: ``dtype_bytes`` is not a positive integer, the heads do not split evenly
            across ``tp``, or the model leaves no room for even one token of KV cache.
    """

    hardware: HardwareProfile
    model: ModelProfile
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.dtype_bytes, bool) or not isinstance(self.dtype_bytes, int):
            raise ValueError(f"dtype_bytes must be an integer, got {self.dtype_bytes!r}")
        if self.dtype_bytes <= 0:
            raise ValueError(f"dtype_bytes must be positive, got {self.dtype_bytes}")
        self._check_heads_split()
        self._check_fits()

    def _check_heads_split(self) -> None:
        for heads in ("num_kv_heads", "num_attention_heads"):
            if getattr(self.model, heads) % self.tp:
                raise ValueError(
                    f"model {self.model.name!r}: {heads}={getattr(self.model, heads)} does not "
                    f"split across tp={self.tp} of hardware {self.hardware.name!r}"
                )

    def _check_fits(self) -> None:
        if self.gpu_kv_capacity_tokens < 1:
            raise ValueError(
                f"model {self.model.name!r} does not fit on hardware {self.hardware.name!r}: "
                f"{self.weight_bytes_per_gpu} weight bytes + {self.hardware.reserve_bytes_per_gpu}"
                f" reserve bytes per GPU leave no room for KV in "
                f"{self.hardware.memory_bytes_per_gpu} bytes"
            )

    @property
    def tp(self) -> int:
        """Return the tensor-parallel degree (GPUs per replica)."""
        return self.hardware.tp

    @property
    def kv_bytes_per_token(self) -> int:
        """Return K and V bytes of one token over all layers and GPUs: ``2·L·H_kv·d·b``."""
        m = self.model
        return 2 * m.num_layers * m.num_kv_heads * m.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """Return the KV bytes of one token that one GPU holds: ``kv_bytes_per_token / tp``."""
        return self.kv_bytes_per_token // self.tp

    @property
    def weight_bytes(self) -> int:
        """Return the bytes of all weights: ``P · b``."""
        return self.model.num_params * self.dtype_bytes

    @property
    def weight_bytes_per_gpu(self) -> int:
        """Return the weight bytes one GPU holds: ``P · b / tp``, rounded up."""
        return -(-self.weight_bytes // self.tp)

    @property
    def kv_pool_bytes_per_gpu(self) -> int:
        """Return one GPU's memory left for KV: memory − weights per GPU − reserve (may be < 0)."""
        hw = self.hardware
        return hw.memory_bytes_per_gpu - self.weight_bytes_per_gpu - hw.reserve_bytes_per_gpu

    @property
    def gpu_kv_capacity_tokens(self) -> int:
        """Return how many tokens of KV the replica holds on its GPUs.

        Every GPU stores ``1 / tp`` of each token, so the replica's capacity equals one GPU's:
        ``kv_pool_bytes_per_gpu // kv_bytes_per_token_per_gpu`` (0 if the pool is negative).
        """
        return max(0, self.kv_pool_bytes_per_gpu // self.kv_bytes_per_token_per_gpu)

    @property
    def gpu_kv_capacity_bytes(self) -> int:
        """Return the KV bytes the replica holds on its GPUs, all GPUs together."""
        return self.gpu_kv_capacity_tokens * self.kv_bytes_per_token

    @property
    def compute_flops_per_s(self) -> float:
        """Return the replica's achieved compute rate: ``tp · peak · compute_efficiency``."""
        hw = self.hardware
        return self.tp * hw.peak_flops_per_s * hw.compute_efficiency

    @property
    def memory_bandwidth_bytes_per_s_per_gpu(self) -> float:
        """Return one GPU's achieved memory bandwidth: ``peak · bandwidth_efficiency``."""
        hw = self.hardware
        return hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Return the host↔device copy bandwidth of the replica: ``tp · host_link_bytes_per_s``.

        Each GPU copies its own shard of the KV over its own link, in parallel.
        """
        return self.tp * self.hardware.host_link_bytes_per_s

    def attention_flops(self, query_key_pairs: int) -> float:
        """Return attention FLOPs for ``query_key_pairs`` per layer and head: ``4·L·H·d·pairs``."""
        m = self.model
        return 4.0 * m.num_layers * m.num_attention_heads * m.head_dim * query_key_pairs

    def prefill_flops(self, new_tokens: int, cached_tokens: int) -> float:
        """Return the FLOPs to prefill ``new_tokens`` over ``cached_tokens`` (causal).

        ``2·P·n + 4·L·H·d·(n·m + n·(n+1)/2)``.
        """
        pairs = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2
        return 2.0 * self.model.num_params * new_tokens + self.attention_flops(pairs)

    def decode_flops(self, batch_size: int, kv_tokens_read: int) -> float:
        """Return the FLOPs of one decode step: ``2·P·batch + 4·L·H·d·kv_tokens_read``."""
        return 2.0 * self.model.num_params * batch_size + self.attention_flops(kv_tokens_read)

    def step_cost(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_batch: int,
        decode_kv_tokens: int,
    ) -> StepCost:
        """Return the roofline of one continuous-batching step.

        The step's FLOPs add up over its prefill chunks and decode batch; its memory traffic is
        the weights once plus every KV token touched; the two overlap (module docstring).

        Args:
            prefill_chunks: ``(new_tokens, cached_tokens)`` per prefilling sequence
                (``PrefillChunk`` or plain pairs); ``new_tokens >= 1``, ``cached_tokens >= 0``.
            decode_batch: sequences decoding one token each, ``>= 0``.
            decode_kv_tokens: context tokens those sequences attend to, summed over the batch
                (each including its new token), ``>= 0``; 0 when ``decode_batch`` is 0.

        Returns:
            A ``StepCost``; all zeros for an empty step (nothing runs, no weights are read).

        Raises:
            ValueError: a count is negative, a chunk has no new tokens, or KV tokens are read
                with no decode batch.
        """
        if not isinstance(prefill_chunks, (list, tuple)):
            prefill_chunks = list(prefill_chunks)
        flops, bytes_per_gpu = self._step_work(prefill_chunks, decode_batch, decode_kv_tokens)
        t = self._terms
        return StepCost(
            flops=flops,
            bytes_per_gpu=bytes_per_gpu,
            compute_s=flops / t.compute_flops_per_s,
            memory_s=bytes_per_gpu / t.memory_bandwidth_bytes_per_s_per_gpu,
            overhead_s=self._overhead_s(len(prefill_chunks) + decode_batch),
            overlap=t.overlap,
        )

    def _overhead_s(self, sequences: int) -> float:
        """Return a step's overheads beyond the roofline: ``step_overhead_s`` plus
        ``sequences · sequence_overhead_s``; ``0.0`` for an empty step."""
        t = self._terms
        if not sequences or not t.refined:
            return 0.0
        return t.step_overhead_s + sequences * t.sequence_overhead_s

    def _step_work(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_batch: int, decode_kv_tokens: int
    ) -> tuple[float, float]:
        """Return :meth:`step_cost`'s ``(flops, bytes_per_gpu)``, validating as it says."""
        if not isinstance(prefill_chunks, (list, tuple)):
            prefill_chunks = list(prefill_chunks)
        _check_count("decode_batch", decode_batch)
        _check_count("decode_kv_tokens", decode_kv_tokens)
        if decode_batch == 0 and decode_kv_tokens:
            raise ValueError(f"decode_kv_tokens={decode_kv_tokens} with decode_batch=0")
        if not prefill_chunks and decode_batch == 0:
            return 0.0, 0.0
        # the formulas of decode_flops, prefill_flops and the roofline rates, with their
        # constant factors taken once (the same products, so the same floats); a sim
        # step asks up to three times
        t = self._terms
        flops = t.matmul_flops_per_token * decode_batch + t.attention_flops_per_pair * (
            decode_kv_tokens
        )
        kv_tokens = decode_kv_tokens
        if prefill_chunks:
            prefill = 0  # sum()'s start: the same additions in the same order
            for i, (new, cached) in enumerate(prefill_chunks):
                if new < 1 or cached < 0:
                    _chunk(i, (new, cached))  # raises
                pairs = new * cached + new * (new + 1) // 2
                prefill += t.matmul_flops_per_token * new + t.attention_flops_per_pair * pairs
                kv_tokens += new + cached
            flops += prefill
        return flops, float(t.weight_bytes_per_gpu + kv_tokens * t.kv_bytes_per_token_per_gpu)

    @functools.cached_property
    def _terms(self) -> _Terms:
        """The step roofline's constant factors (the profiles are frozen)."""
        m, hw = self.model, self.hardware
        return _Terms(
            matmul_flops_per_token=2.0 * m.num_params,
            attention_flops_per_pair=4.0 * m.num_layers * m.num_attention_heads * m.head_dim,
            weight_bytes_per_gpu=self.weight_bytes_per_gpu,
            kv_bytes_per_token_per_gpu=self.kv_bytes_per_token_per_gpu,
            compute_flops_per_s=self.compute_flops_per_s,
            memory_bandwidth_bytes_per_s_per_gpu=self.memory_bandwidth_bytes_per_s_per_gpu,
            step_overhead_s=hw.step_overhead_s,
            sequence_overhead_s=hw.sequence_overhead_s,
            overlap=hw.overlap,
            refined=(hw.step_overhead_s, hw.sequence_overhead_s, hw.overlap) != (0.0, 0.0, 1.0),
        )

    def step_s(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_batch: int,
        decode_kv_tokens: int,
    ) -> float:
        """Return the seconds of one continuous-batching step (see ``step_cost``)."""
        if not isinstance(prefill_chunks, (list, tuple)):
            prefill_chunks = list(prefill_chunks)
        flops, bytes_per_gpu = self._step_work(prefill_chunks, decode_batch, decode_kv_tokens)
        t = self._terms
        compute_s = flops / t.compute_flops_per_s
        memory_s = bytes_per_gpu / t.memory_bandwidth_bytes_per_s_per_gpu
        if not t.refined:
            return max(compute_s, memory_s)
        overhead_s = self._overhead_s(len(prefill_chunks) + decode_batch)
        return _combined(compute_s, memory_s, overhead_s, t.overlap)

    def prefill_compute_s(self, prefill_chunks: Sequence[tuple[int, int]]) -> float:
        """Return the compute seconds of ``prefill_chunks`` alone in a step:
        ``step_cost(prefill_chunks, 0, 0).compute_s`` (their FLOPs at ``tp·F``).

        Raises:
            ValueError: as :meth:`step_cost`.
        """
        return self._step_work(prefill_chunks, 0, 0)[0] / self._terms.compute_flops_per_s

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Return the seconds to prefill ``new_tokens`` over ``cached_tokens`` alone in a step.

        ``max(prefill FLOPs / (tp·F), (P·b + (m + n)·kv bytes per token) / tp / B)``: usually
        compute-bound, never faster than one read of the weights.
        """
        return self.step_s([(new_tokens, cached_tokens)], 0, 0)

    def prefill_slack_tokens(self, decode_batch: int, decode_kv_tokens: int) -> int:
        """Return the prefill tokens a decode step can carry without lengthening it.

        A decode step is bandwidth-bound: it reads the weights and the batch's KV while
        the compute units idle. Prefill tokens fill that slack at ``2·P`` FLOPs each, so
        ``floor((memory_s − compute_s) · tp · F / (2·P))`` of them ride for free; more
        make the step compute-bound and stall every decoding sequence for each extra
        token (Sarathi-Serve's stall-free token budget, Agrawal et al., OSDI 2024, on
        this roofline). Attention FLOPs of the chunk are left out, so a step carrying
        the budget runs at most slightly past the decode step's time. With a refined
        profile's ``overlap`` ``o < 1`` no token is wholly free (under the memory time
        each still adds ``(1 − o)`` of its compute); the budget is then the interpolation
        ``o · (memory_s − compute_s) · tp · F / (2·P)``: exact at ``o = 1`` (every GPU
        profile), none at ``o = 0`` (a CPU, where smaller chunks only add forwards), and a
        heuristic between, which no shipped profile uses.

        Args:
            decode_batch: sequences decoding one token each, ``>= 0``.
            decode_kv_tokens: context tokens they attend to in total, ``>= 0``.

        Returns:
            Tokens, ``>= 0``; for an empty batch, the tokens whose compute fills one
            read of the weights.

        Raises:
            ValueError: a negative count, or KV tokens with no decode batch.
        """
        if decode_batch == 0:
            _check_count("decode_kv_tokens", decode_kv_tokens)
            if decode_kv_tokens:
                raise ValueError(f"decode_kv_tokens={decode_kv_tokens} with decode_batch=0")
            slack_s = self.weight_bytes_per_gpu / self.memory_bandwidth_bytes_per_s_per_gpu
        else:
            flops, bytes_per_gpu = self._step_work((), decode_batch, decode_kv_tokens)
            t = self._terms
            memory_s = bytes_per_gpu / t.memory_bandwidth_bytes_per_s_per_gpu
            slack_s = max(0.0, memory_s - flops / t.compute_flops_per_s)
        if self._terms.overlap < 1.0:
            slack_s *= self._terms.overlap  # the interpolation of the docstring
        per_token_s = 2.0 * self.model.num_params / self.compute_flops_per_s
        return int(slack_s / per_token_s)

    def forward_s(self) -> float:
        """Return the seconds of a decode step that do not grow with its batch (the
        weights' read, the step's overhead): ``2 · decode_step_s(1, 1) −
        decode_step_s(2, 2)``, a one-sequence step less what a second sequence adds."""
        return 2.0 * self.decode_step_s(1, 1) - self.decode_step_s(2, 2)

    def prefill_token_s(self) -> float:
        """Return a prefill token's compute seconds, ``2·P / (tp·F)``: what recomputing
        one token costs in a compute-bound chunk (its attention left out)."""
        return self._terms.matmul_flops_per_token / self._terms.compute_flops_per_s

    def decode_step_s(self, batch_size: int, kv_tokens_read: int) -> float:
        """Return the seconds of one decode step of ``batch_size`` sequences alone in a step.

        ``max((P·b + kv_tokens_read·kv bytes per token) / tp / B, decode FLOPs / (tp·F))``:
        usually bandwidth-bound.

        Raises:
            ValueError: ``batch_size < 1`` or ``kv_tokens_read < 0``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return self.step_s([], batch_size, kv_tokens_read)

    def decode_run(self, kv_tokens_read: np.ndarray) -> DecodeRun:
        """Return the seconds and FLOPs of one sequence decoding alone, one step per entry.

        The sum of ``decode_step_s(1, k)`` over ``k`` in ``kv_tokens_read`` (each step's
        context, its new token included), computed at once: each step's FLOPs and bytes
        are affine in ``k`` (module docstring).

        Args:
            kv_tokens_read: ``(steps,)`` context tokens per step, ``>= 0``.

        Raises:
            ValueError: a negative context.
        """
        k = np.asarray(kv_tokens_read, dtype=np.float64)
        if len(k) and k.min() < 0:
            raise ValueError(f"kv_tokens_read must be >= 0, got {k.min():g}")
        t = self._terms  # the step roofline's factors, as step_cost(-, 1, k) takes them
        flops = t.matmul_flops_per_token + t.attention_flops_per_pair * k
        bytes_per_gpu = t.weight_bytes_per_gpu + k * t.kv_bytes_per_token_per_gpu
        compute_s = flops / t.compute_flops_per_s
        memory_s = bytes_per_gpu / t.memory_bandwidth_bytes_per_s_per_gpu
        step_s = np.maximum(compute_s, memory_s)
        if t.refined:
            step_s = step_s + (1.0 - t.overlap) * np.minimum(compute_s, memory_s)
            step_s = step_s + self._overhead_s(1)
        return DecodeRun(float(step_s.sum()), float(flops.sum()))

    def transfer_s(self, num_bytes: int) -> float:
        """Return the seconds to copy ``num_bytes`` (all GPUs together) host↔device.

        ``num_bytes / bandwidth_bytes_per_s``.

        Raises:
            ValueError: ``num_bytes < 0``.
        """
        _check_count("num_bytes", num_bytes)
        return num_bytes / self.bandwidth_bytes_per_s


def _combined(compute_s: float, memory_s: float, overhead_s: float, overlap: float) -> float:
    """Return a step's seconds from its compute and memory seconds (module docstring):
    ``max`` alone at the roofline's defaults, bit for bit."""
    step_s = max(compute_s, memory_s)
    if overlap < 1.0:
        step_s += (1.0 - overlap) * min(compute_s, memory_s)
    if overhead_s:
        step_s += overhead_s
    return step_s


def _check_count(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def _chunk(index: int, chunk: tuple[int, int]) -> PrefillChunk:
    new_tokens, cached_tokens = chunk
    if new_tokens < 1:
        raise ValueError(f"prefill_chunks[{index}]: new_tokens must be >= 1, got {new_tokens}")
    if cached_tokens < 0:
        raise ValueError(
            f"prefill_chunks[{index}]: cached_tokens must be >= 0, got {cached_tokens}"
        )
    return PrefillChunk(new_tokens, cached_tokens)
