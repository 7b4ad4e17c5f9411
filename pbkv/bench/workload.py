"""The workload a bench serves: its prompts checked, its gaps scaled, its arrivals timed
for an open loop (Poisson, at a rate or a fraction of the strongest baseline's capacity),
and the GPU KV tier sized for it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from pbkv.actors.workload import Workflow
from pbkv.bench.config import BenchConfig
from pbkv.bench.row import run_policy
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.profile import list_profiles, load_hardware, load_model


def gpu_tokens_for(workload: Sequence[Workflow], concurrency: int) -> int:
    """Return half the KV tokens ``concurrency`` workflows would keep for reuse.

    A workflow's reusable set is, per agent, its longest prompt + output; the shared
    preamble is counted once. The median workflow stands for one slot. Never less than
    the largest single request plus a little room (64 tokens), so every request fits.
    """
    per_workflow = []
    for wf in workload:
        longest: dict[str, int] = {}
        for s in wf.steps:
            longest[s.agent] = max(longest.get(s.agent, 0), s.prompt_tokens + s.output_tokens)
        preamble = len(wf.steps[0].segments[0].token_ids) if wf.steps else 0
        per_workflow.append(sum(longest.values()) - preamble * (len(longest) - 1))
    slots = min(concurrency, len(per_workflow))
    largest = max((s.prompt_tokens + s.output_tokens for w in workload for s in w.steps), default=0)
    return max(int(0.5 * slots * float(np.median(per_workflow))), largest + 64)


def check_prompts(workload: Sequence[Workflow], app: str) -> None:
    """Raise ``ValueError`` naming the first step of ``app``'s workload whose prompt is empty
    (no engine serves one; a user's app can generate one)."""
    for w in workload:
        for i, s in enumerate(w.steps):
            if not s.prompt_tokens:
                raise ValueError(
                    f"app {app!r}: workflow {w.workflow_id!r} step {i} (agent {s.agent!r}) "
                    "has an empty prompt"
                )


def check_fits(
    workload: Sequence[Workflow], gpu_kv_tokens: int, config: BenchConfig, cost: CostModel
) -> None:
    """Raise ``ValueError`` when the GPU tier cannot hold the workload's largest request,
    saying whether ``--gpu-kv-tokens`` or the profile's KV capacity is the limit."""
    largest = max((s.prompt_tokens + s.output_tokens for w in workload for s in w.steps), default=0)
    if -(-largest // config.block_size) * config.block_size <= gpu_kv_tokens:
        return
    capacity = cost.gpu_kv_capacity_tokens
    shipped = list_profiles()
    fix = (
        f"the tier is capped at {config.hardware} x {config.model}'s KV capacity "
        f"({capacity:,} tokens): pick a profile with more (--hardware, --model; "
        f"shipped: {', '.join((*shipped.hardware, *shipped.model))})"
        if gpu_kv_tokens >= capacity
        else "raise --gpu-kv-tokens"
    )
    raise ValueError(
        f"GPU KV capacity of {gpu_kv_tokens:,} tokens cannot hold the workload's largest "
        f"request ({largest:,} prompt + output tokens); {fix}"
    )


def scale_gaps(workload: Sequence[Workflow], factor: float) -> list[Workflow]:
    """Return ``workload`` with every step's tool/think gap multiplied by ``factor`` (what
    ``open_runtime(gap_scale=factor)`` does to the same app's simulated tools and replies).

    Raises:
        ValueError: ``factor`` negative or not finite.
    """
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"gap_scale must be finite and >= 0, got {factor}")
    return [
        dataclasses.replace(
            w, steps=tuple(dataclasses.replace(s, gap_s=s.gap_s * factor) for s in w.steps)
        )
        for w in workload
    ]


CAPACITY_SPEC = "lru:workflow"
"""The strongest baseline, whose closed-loop throughput ``--load`` is a fraction of."""


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Return ``n`` arrival times (seconds from 0) of a Poisson process at ``rate`` per
    second: exponential gaps of mean ``1 / rate``, seeded by ``seed``.

    Raises:
        ValueError: ``rate <= 0``.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 workflows per second, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return [float(t) for t in np.cumsum(gaps) - gaps[0]]  # the first arrives at 0


def open_loop_at(
    config: BenchConfig, workload: Sequence[Workflow], app: object
) -> tuple[BenchConfig, list[Workflow]]:
    """Return ``config`` and ``workload`` for an open-loop run at ``config.rate`` (or at
    ``config.load`` × the strongest baseline's measured capacity): Poisson arrivals.

    Raises:
        ValueError: both or a non-positive ``rate`` / ``load``.
    """
    if config.rate is not None and config.load is not None:
        raise ValueError("give --rate or --load, not both")
    rate = config.rate
    if config.load is not None:
        if not config.load > 0:
            raise ValueError(f"load must be > 0, got {config.load}")
        rate = config.load * baseline_capacity(config, workload, app)
    assert rate is not None
    times = poisson_arrivals(len(workload), rate, config.seed)
    timed = [dataclasses.replace(w, arrival_s=t) for w, t in zip(workload, times, strict=True)]
    return dataclasses.replace(config, open_loop=True, rate=rate), timed


def baseline_capacity(config: BenchConfig, workload: Sequence[Workflow], app: object) -> float:
    """Return the strongest baseline's capacity: :data:`CAPACITY_SPEC`'s throughput in
    workflows per second, closed loop at ``config.concurrency`` on ``workload``."""
    closed = dataclasses.replace(config, open_loop=False, rate=None, load=None)
    wanted = config.gpu_kv_tokens or gpu_tokens_for(workload, config.concurrency)
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    result = run_policy(
        workload,
        closed,
        CAPACITY_SPEC,
        (),
        gpu_kv_tokens=min(wanted, cost.gpu_kv_capacity_tokens),
        step_graph_edges=tuple(getattr(app, "edges", ())),
    )
    return result.throughput_workflows_per_s
