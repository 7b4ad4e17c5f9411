"""A lower bound on a workload's mean workflow latency in the sim engine (DESIGN §7.1).

No policy, scheduler, prefetch or tier size served by :class:`~pbkv.engines.sim.SimEngine`
on this cost model finishes a workload's workflows sooner on average, when the workload
is replayed as the bench replays it (:func:`~pbkv.actors.serve.serve_workflows`: each
script's invocations in order, one at a time) and the engine fails no request. The mean
is the one the bench reports: over the workflows whose script ends ``end`` or
``recursion_limit`` (:data:`MEASURED_REASONS`); one whose script ends
``error`` or ``aborted`` still runs, and holds a slot, but its latency is left out. A
live app that fans out (:func:`~pbkv.live.driver.serve_app`) runs some invocations at
once, so its scripted steps do not bound it. The bound is the larger of two, each
proved from the engine's rules and the roofline of
:class:`~pbkv.engines.sim.costmodel.CostModel`:

- **Isolated critical path.** A workflow's invocations run back to back, each after its
  ``gap_s``. An invocation's prompt can at best find cached every full block that some
  other request could have computed first: a block of any request of another workflow
  (prompt or output), or of an earlier invocation of its own. The engine recomputes at
  least one prompt token, and a step is never shorter than its own share of work alone
  (the roofline is a max of sums), so the prefill takes at least
  ``prefill_s(new, cached)`` and the ``d - 1`` decode steps after the first token at
  least ``decode_step_s(1, context)`` each. Nothing waits, loads or is evicted.
- **Throughput (closed loop only).** ``c`` slots, every start at a finish: while any
  workflow waits to start, all ``c`` slots are busy, and the ``e`` left-out workflows
  hold at most ``min(e, c)`` of them, so the ``m`` measured ones hold at least
  ``c' = c − min(e, c)``. Their latencies are the time-integral of how many of them are
  in flight, so ``Σ L ≥ ∫ min(c', m − finished(t)) dt = Σ_{k > m−c'} F_(k)``, the last
  ``c'`` of their finish times (equality when none is left out). By the ``k``-th of
  those finishes, ``k`` workflows' work is done on one GPU replica whose steps run one
  at a time, so ``F_(k)`` is at least those workflows' FLOPs over the compute rate, and at
  least their KV bytes plus a weight read per decode step over the bandwidth (each
  workflow needs one step per output token). The ``k`` finished workflows are unknown,
  so their sums are bounded by the ``k`` smallest.

Both sides are summed in float64 and the result is lowered by one part in 10⁹, below the
rounding of the virtual clock's sums, so an engine that reaches the bound exactly (one
workflow, nothing shared) is not reported above it.

Source: the roofline of DESIGN §7.1; the closed-loop identity is Little's law over a finite
run (the time-integral of the number in flight).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pbkv.kvmanager.keys import block_keys

from .costmodel import CostModel

__all__ = ["MEASURED_REASONS", "LatencyFloor", "ScriptedStep", "ScriptedWorkflow", "latency_floor"]

MEASURED_REASONS = ("end", "recursion_limit")
"""End reasons of the workflows a mean latency averages over by default (the bench's,
:data:`pbkv.actors.events.RAN_TO_END`, which the engines layer may not import)."""


class ScriptedStep(Protocol):
    """One invocation of a script, as :class:`pbkv.actors.workload.Step` gives it."""

    @property
    def prompt_token_ids(self) -> tuple[int, ...]: ...
    @property
    def output_token_ids(self) -> tuple[int, ...]: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def gap_s(self) -> float: ...


class ScriptedWorkflow(Protocol):
    """A replayed script, as :class:`pbkv.actors.workload.Workflow` gives it."""

    @property
    def steps(self) -> Sequence[ScriptedStep]: ...
    @property
    def tenant(self) -> str: ...
    @property
    def end_reason(self) -> str: ...


ROUNDING_GUARD = 1.0 - 1e-9
"""The bound is scaled by this, below the float rounding of the engine's clock sums."""


@dataclass(frozen=True, slots=True)
class LatencyFloor:
    """What no sim run of a workload can beat, in simulated seconds.

    Attributes:
        mean_latency_s: the bound on mean workflow latency over the measured workflows
            (script ending in ``measured_reasons``), ``max(isolated_s,
            throughput_s)`` (``isolated_s`` alone for an open-loop workload).
        isolated_s: the mean over measured workflows of their critical path alone, every
            shareable block cached.
        throughput_s: the closed-loop bound from the GPU's compute rate and bandwidth;
            0 for an open-loop workload, or when left-out workflows may hold every slot.
    """

    mean_latency_s: float
    isolated_s: float
    throughput_s: float


@dataclass(frozen=True, slots=True)
class _Work:
    """One workflow's least work: critical path seconds, FLOPs, KV bytes per GPU, steps."""

    path_s: float
    flops: float
    kv_bytes_per_gpu: float
    steps: int


def latency_floor(
    workload: Sequence[ScriptedWorkflow],
    cost: CostModel,
    *,
    block_size: int,
    concurrency: int,
    open_loop: bool = False,
    measured_reasons: Collection[str] = MEASURED_REASONS,
) -> LatencyFloor:
    """Return the lower bound on ``workload``'s mean workflow latency (module docstring).

    Args:
        workload: the workflows, each run to its end (the engine replays every step).
        cost: the roofline the sim engine steps by.
        block_size: tokens per KV block (only full blocks are cached).
        concurrency: workflows in flight at once (closed loop), ``>= 1``.
        open_loop: workflows start at their arrival times; only the isolated bound
            holds then.
        measured_reasons: the script end reasons whose workflows the mean averages
            over; the others still run, hold slots and share blocks.

    Returns:
        The bound with its two parts; all zeros when no workflow is measured.

    Raises:
        ValueError: ``concurrency < 1`` or ``block_size < 1``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    works = [  # every workflow runs, so every one's blocks may be shared
        _least_work(w, cost, block_size, shared) for w, shared in _shareable(workload, block_size)
    ]
    measured = [k for k, w in zip(works, workload, strict=True) if w.end_reason in measured_reasons]
    if not measured:
        return LatencyFloor(0.0, 0.0, 0.0)
    m = len(measured)
    isolated = sum(w.path_s for w in measured)
    slots = concurrency - min(len(works) - m, concurrency)  # c' of the module docstring
    throughput = 0.0 if open_loop or slots < 1 else _throughput_s(measured, cost, slots)
    return LatencyFloor(
        ROUNDING_GUARD * max(isolated, throughput) / m,
        ROUNDING_GUARD * isolated / m,
        ROUNDING_GUARD * throughput / m,
    )


def _throughput_s(works: Sequence[_Work], cost: CostModel, slots: int) -> float:
    """Return the sum of the last ``slots`` finish-time bounds of ``works`` (closed loop)."""
    flops = np.cumsum(np.sort([w.flops for w in works]))
    kv = np.cumsum(np.sort([w.kv_bytes_per_gpu for w in works]))
    steps = np.sort([w.steps for w in works])  # the k-th finisher ran >= steps[k-1]
    compute_s = flops / cost.compute_flops_per_s
    memory_s = (cost.weight_bytes_per_gpu * steps + kv) / cost.memory_bandwidth_bytes_per_s_per_gpu
    finish_s = np.maximum(compute_s, memory_s)  # F_(k) >= finish_s[k-1]
    return float(finish_s[len(works) - min(slots, len(works)) :].sum())


def _shareable(
    workload: Sequence[ScriptedWorkflow], block_size: int
) -> list[tuple[ScriptedWorkflow, list[int]]]:
    """Pair each workflow with, per invocation, how many leading prompt blocks some other
    request could have computed before it (another workflow's, or an earlier step's)."""
    first_step: list[dict[int, int]] = []  # per workflow: block key -> first step holding it
    prompts: list[list[list[int]]] = []
    holders: dict[int, int] = {}  # block key -> workflows holding it (counted up to 2)
    for w in workload:
        seen: dict[int, int] = {}
        keyed = []
        for j, step in enumerate(w.steps):
            prompt = step.prompt_token_ids
            keys = block_keys(prompt, block_size, w.tenant)
            keyed.append(keys)
            whole = block_keys(prompt + step.output_token_ids, block_size, w.tenant, known=keys)
            for key in whole:
                seen.setdefault(key, j)
        for key in seen:
            holders[key] = min(2, holders.get(key, 0) + 1)
        first_step.append(seen)
        prompts.append(keyed)
    out = []
    for w, seen, keyed in zip(workload, first_step, prompts, strict=True):
        shared = []
        for j, keys in enumerate(keyed):
            count = 0
            for key in keys:
                if holders[key] < 2 and seen[key] >= j:
                    break
                count += 1
            shared.append(count)
        out.append((w, shared))
    return out


def _least_work(w: ScriptedWorkflow, cost: CostModel, block_size: int, shared: list[int]) -> _Work:
    path_s = flops = kv_tokens = 0.0
    steps = 0
    for step, blocks in zip(w.steps, shared, strict=True):
        p, d = step.prompt_tokens, max(1, step.output_tokens)
        cached = min(blocks * block_size, p - 1)  # the engine recomputes >= 1 token
        new = p - cached
        contexts = np.arange(p + 1, p + d, dtype=np.float64)  # decode steps after token 1
        decode = cost.decode_run(contexts)
        path_s += step.gap_s + cost.prefill_s(new, cached) + decode.seconds
        flops += cost.prefill_flops(new, cached) + decode.flops
        kv_tokens += p + float(contexts.sum())
        steps += d
    return _Work(path_s, flops, kv_tokens * cost.kv_bytes_per_token_per_gpu, steps)
