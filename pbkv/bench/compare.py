"""Compare cache policies on the same generated workload in one run (§9).

Each policy spec is one row (:mod:`pbkv.bench.row`) serving an identical copy of the
workload (:mod:`pbkv.bench.workload`) through the full actor system on the virtual-time
engine; beside the rows, the bounds no policy beats (:class:`~pbkv.bench.results.Bounds`).
The same seed gives the same figures.

The bench's records (:mod:`~pbkv.bench.config`, :mod:`~pbkv.bench.results`) and steps
(:mod:`~pbkv.bench.forecasters`, :mod:`~pbkv.bench.row`, :mod:`~pbkv.bench.workload`) live
in their own modules; ``__all__`` re-exports the names other code imports from here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

from pbkv.actors.events import RAN_TO_END
from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.bench.config import DEFAULT_POLICIES, BenchConfig, resolve_spec
from pbkv.bench.forecasters import build_forecasters
from pbkv.bench.results import (
    BenchRun,
    Bounds,
    PolicyResult,
    baseline_result,
    row_name,
    summarise_outcomes,
)
from pbkv.bench.row import run_policy
from pbkv.bench.workload import (
    check_fits,
    check_prompts,
    gpu_tokens_for,
    open_loop_at,
    poisson_arrivals,
    scale_gaps,
)
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.floor import latency_floor
from pbkv.engines.sim.profile import load_hardware, load_model
from pbkv.kvmanager import AccessLog, get_policy
from pbkv.live.build import ONLINE_PREDICTOR
from pbkv.predictor.base import Forecaster

log = logging.getLogger(__name__)

__all__ = [  # what importers of this module use; the rest lives in its own module
    "BenchConfig",
    "Bounds",
    "DEFAULT_POLICIES",
    "FLOOR_SPEC",
    "PolicyResult",
    "build_forecasters",
    "compare_policies",
    "gpu_tokens_for",
    "poisson_arrivals",
    "resolve_spec",
    "run_bench",
    "run_policy",
    "scale_gaps",
    "summarise_outcomes",
]


FLOOR_SPEC = "lru:fcfs-balanced"
"""The uncontested run's ``policy:scheduler``: arrival order and balanced (stall-free)
batches, under a GPU tier that holds everything (``Bounds.uncontested_latency_s``)."""


def compare_policies(
    config: BenchConfig,
    *,
    on_outcome: Callable[[str, WorkflowOutcome], None] | None = None,
) -> tuple[list[PolicyResult], int]:
    """Run every policy of ``config`` on one workload, without bounds.

    Returns:
        The per-policy results (in ``config.policies`` order) and the GPU KV capacity in
        tokens that was used.

    Raises:
        ValueError: unknown app, policy, scheduler, predictor or profile name.
    """
    run = run_bench(config, on_outcome=on_outcome, bounds=False)
    return run.results, run.gpu_kv_tokens


def run_bench(
    config: BenchConfig,
    *,
    on_outcome: Callable[[str, WorkflowOutcome], None] | None = None,
    bounds: bool = True,
) -> BenchRun:
    """Run every policy spec of ``config`` on one workload, and the bounds beside them.

    ``on_outcome(spec, outcome)`` is called as each workflow ends (progress bars); the
    uncontested reference run reports as ``"uncontested"``.

    Raises:
        ValueError: unknown app, policy, scheduler, predictor or profile name.
    """
    from pbkv.examples import get_app  # a registered name or a user's "module:attribute"

    for spec in config.policies:
        resolve_spec(spec, config.scheduler)
    app = get_app(config.app, gap_model=config.gap_model)
    if getattr(app, "open_loop", False):  # a trace with arrival times (mooncake)
        config = dataclasses.replace(config, open_loop=True)
    workload = app.generate(config.workflows, config.seed)
    check_prompts(workload, config.app)
    if config.gap_scale != 1.0:
        workload = scale_gaps(workload, config.gap_scale)
    if config.rate is not None or config.load is not None:
        config, workload = open_loop_at(config, workload, app)
    if config.open_loop and all(w.arrival_s <= 0 for w in workload):
        log.warning(
            "open loop: app %r gives every workflow arrival time 0, so each starts as soon "
            "as a slot frees, as in closed loop",
            config.app,
        )
    forecasters: list[Forecaster] = []
    if config.predictor != ONLINE_PREDICTOR and any(
        get_policy(resolve_spec(spec, config.scheduler)[0]).uses_forecasts
        for spec in config.policies
    ):
        train = app.generate(config.train_workflows, config.seed + 10_000)
        forecasters = build_forecasters(config, app.agents, app.edges, workload, train)
    wanted = config.gpu_kv_tokens or gpu_tokens_for(workload, config.concurrency)
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    gpu_tokens = min(wanted, cost.gpu_kv_capacity_tokens)
    check_fits(workload, gpu_tokens, config, cost)
    results = []
    for spec in config.policies:
        callback = None if on_outcome is None else (lambda o, p=spec: on_outcome(p, o))
        results.append(
            run_policy(
                workload,
                config,
                spec,
                forecasters,
                gpu_kv_tokens=gpu_tokens,
                step_graph_edges=tuple(app.edges),
                app_agents=tuple(app.agents),
                on_outcome=callback,
                access_log=AccessLog(config.block_size) if bounds else None,
            )
        )
    found = None
    if bounds:
        reference = None if on_outcome is None else (lambda o: on_outcome("uncontested", o))
        found = _bounds(workload, config, results, reference)
    return BenchRun(
        results, gpu_tokens, wanted, cost.gpu_kv_capacity_tokens, found, rate=config.rate
    )


def _bounds(
    workload: Sequence[Workflow],
    config: BenchConfig,
    results: Sequence[PolicyResult],
    on_outcome: Callable[[WorkflowOutcome], None] | None,
) -> Bounds:
    """Return the bounds: the rows' ceiling and MIN (of the lru row, else the first), the
    latency floor, and the latency of an uncontested run (a GPU tier that holds every
    token served) for reference."""
    base = baseline_result(results)
    bs = config.block_size
    everything = sum(s.prompt_tokens + s.output_tokens + bs for w in workload for s in w.steps)
    uncontested = dataclasses.replace(config, host_kv_tokens=0)
    reference = run_policy(
        workload,
        uncontested,
        FLOOR_SPEC,
        (),
        gpu_kv_tokens=everything,
        on_outcome=on_outcome,
    )
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    bound = latency_floor(
        workload,
        cost,
        block_size=bs,
        concurrency=config.concurrency,
        open_loop=config.open_loop,
        measured_reasons=RAN_TO_END,  # the workflows summarise_outcomes averages over
    )
    return Bounds(
        ceiling_hit_rate=max(r.ceiling_hit_rate for r in results),
        floor_latency_s=bound.mean_latency_s,
        min_hit_rate=base.min_gpu_hit_rate,
        min_total_hit_rate=base.min_total_hit_rate,
        min_order=row_name(base),
        uncontested_latency_s=reference.mean_latency_s,
    )
