"""Render policy comparisons: the terminal table, what won and why, and the JSON file (§9)."""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import msgspec
from rich import box
from rich.console import Group, RenderableType
from rich.constrain import Constrain
from rich.table import Table
from rich.text import Text

from pbkv.bench.compare import FLOOR_SPEC
from pbkv.bench.config import BenchConfig
from pbkv.bench.results import (
    END_REASONS,
    BenchRun,
    Bounds,
    PolicyResult,
    baseline_result,
    row_name,
)
from pbkv.bench.sweeps import SweepPoint


def ratio(value: float, baseline: float) -> float:
    """Return ``value / baseline`` (``nan`` when the baseline is zero)."""
    return value / baseline if baseline else float("nan")


END_COLUMN = "ends"
"""The table's column counting workflows by end reason: end/limit/error/aborted."""


def ratio_text(value: float, baseline: float) -> str:
    """Return ``value / baseline`` as ``"1.234x"``, or ``"n/a"`` when the baseline is zero
    or either is not a number (no workflow measured; printing ``nanx`` read like a bug)."""
    if not baseline or math.isnan(value) or math.isnan(baseline):
        return "n/a"
    return f"{value / baseline:.3f}x"


def figure_text(value: float, digits: int = 2) -> str:
    """Return ``value`` with ``digits`` decimals, or ``"n/a"`` for ``nan`` (a mean over no
    measured workflow, e.g. when every one ended in error)."""
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


TABLE_WIDTH = 100
"""Columns a bench table fits in, with the blocks printed under it."""

BATCHING, ADMISSION, EVICTION, PREFETCH = "batching", "admission", "eviction", "prefetch"
CACHE_POLICY = "cache policy"
"""A part's name when one step spans eviction and prefetch (no ``he:workflow`` row)."""

GAIN_LADDER: tuple[str, ...] = (
    "lru:fcfs",
    "lru:fcfs-balanced",
    "lru:workflow",
    "he:workflow",
    "pbkv:workflow",
)
"""The rows the gain over ``lru`` is decomposed along; ``GAIN_PARTS[i]`` is the step
from row ``i`` to row ``i + 1``, so each step changes one thing."""

GAIN_PARTS: tuple[str, ...] = (BATCHING, ADMISSION, EVICTION, PREFETCH)
"""What each step of :data:`GAIN_LADDER` measures: balanced (stall-free) batches, the
``workflow`` scheduler's admission, forecast-scored eviction (``he``), and what pbkv adds
to ``he`` (prefetch, queued prefixes and workflow age in the eviction key)."""

GAIN_ASIDES: tuple[tuple[str, str, str], ...] = (
    ("eviction on fcfs", "lru:fcfs", "he:fcfs"),
    ("cache policy on fcfs", "lru:fcfs", "pbkv:fcfs"),
)
"""(name, from row, to row): a cache policy's gain without the ``workflow`` scheduler,
reported when both rows ran; not a part of the product."""

_HE_ROW = "he:workflow"

_PART_NOTES = {
    BATCHING: "stall-free batches (vLLM V1); any engine",
    ADMISSION: "the workflow scheduler's admission order",
    EVICTION: "forecast-scored eviction (he)",
    PREFETCH: "pbkv over he: prefetch, queued prefixes, age",
    CACHE_POLICY: "eviction + prefetch",
}


@dataclasses.dataclass(frozen=True, slots=True)
class GainPart:
    """One part of the gain: the latency ratio between two rows of one bench.

    Attributes:
        name: what the step changes (``batching``, ``admission``, ``eviction``,
            ``prefetch``, ``cache policy``; parts a missing row leaves unsplit are
            joined with `` + ``).
        from_row / to_row: the ``policy:scheduler`` rows compared.
        speedup: ``from_row``'s mean workflow latency over ``to_row``'s; ``None`` when
            either row did not run (``nan`` when either measured no workflow).
        missing: the rows the bench lacks: for a measured part, those that would split
            it further; otherwise, those it needs.
    """

    name: str
    from_row: str
    to_row: str
    speedup: float | None
    missing: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class GainDecomposition:
    """The gain of pbkv over lru, split into its parts along :data:`GAIN_LADDER`.

    Attributes:
        reference / target: the ladder's first and last rows (``lru:fcfs``,
            ``pbkv:workflow``).
        total_speedup: ``reference``'s mean latency over ``target``'s (``None`` when
            either did not run); the product of the measured ``parts`` when both ran.
        parts: one per step of the ladder, in order; steps between two rows that ran,
            with no ladder row between them that ran, form one part.
        asides: the :data:`GAIN_ASIDES` whose rows both ran.
        strongest_baseline: the fastest row whose policy is not pbkv's (``None``: none
            measured a latency); see :func:`strongest_baseline`.
        fastest: the fastest row of all (``None``: none measured a latency).
    """

    reference: str
    target: str
    total_speedup: float | None
    parts: tuple[GainPart, ...]
    asides: tuple[GainPart, ...]
    strongest_baseline: str | None
    fastest: str | None


def is_pbkv(result: PolicyResult) -> bool:
    """Return whether a row runs one of pbkv's policies (``pbkv`` or ``pbkv-*``)."""
    return result.policy == "pbkv" or result.policy.startswith("pbkv-")


def fastest_result(results: Sequence[PolicyResult]) -> PolicyResult | None:
    """Return the row with the lowest mean latency (the first of equals), ignoring rows
    that measured none; ``None`` if no row did."""
    measured = [r for r in results if not math.isnan(r.mean_latency_s)]
    return min(measured, key=lambda r: r.mean_latency_s, default=None)


def strongest_baseline(results: Sequence[PolicyResult]) -> PolicyResult | None:
    """Return the strongest baseline: the fastest row (by mean latency) whose policy is
    not pbkv's (:func:`is_pbkv`); ``None`` if no such row measured a latency."""
    return fastest_result([r for r in results if not is_pbkv(r)])


def gain_decomposition(results: Sequence[PolicyResult]) -> GainDecomposition:
    """Split the gain of ``pbkv:workflow`` over ``lru:fcfs`` into the parts the rows allow.

    The steps are those of :data:`GAIN_LADDER`; without an ``he:workflow`` row, eviction
    and prefetch are one step, ``cache policy``. Each part is a latency ratio between two
    ladder rows that ran; where a ladder row is missing, the steps beside it form one
    part, which names the missing row. Steps before the first or after the last ladder
    row that ran are not measured (``speedup`` is ``None``). The first row of each
    ``policy:scheduler`` counts.

    Args:
        results: one bench's rows, in any order.

    Returns:
        The decomposition; its measured parts multiply to ``total_speedup``.
    """
    latency: dict[str, float] = {}
    for r in results:
        latency.setdefault(row_name(r), r.mean_latency_s)
    ladder, names = _ladder(latency)
    ran = [i for i, row in enumerate(ladder) if row in latency]
    first, last = (ran[0], ran[-1]) if ran else (len(names), len(names))
    parts = [
        *(_unmeasured_part(ladder, names, i, latency) for i in range(first)),
        *(_measured_part(ladder, names, a, b, latency) for a, b in pairwise(ran)),
        *(_unmeasured_part(ladder, names, i, latency) for i in range(last, len(names))),
    ]
    asides = [
        GainPart(name, a, b, _speedup(a, b, latency))
        for name, a, b in GAIN_ASIDES
        if a in latency and b in latency
    ]
    baseline, fastest = strongest_baseline(results), fastest_result(results)
    return GainDecomposition(
        reference=ladder[0],
        target=ladder[-1],
        total_speedup=_speedup(ladder[0], ladder[-1], latency),
        parts=tuple(parts),
        asides=tuple(asides),
        strongest_baseline=None if baseline is None else row_name(baseline),
        fastest=None if fastest is None else row_name(fastest),
    )


def _ladder(latency: dict[str, float]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return the ladder's rows and step names: :data:`GAIN_LADDER`, or without its
    ``he:workflow`` row (eviction and prefetch as one step) when that row did not run."""
    if _HE_ROW in latency:
        return GAIN_LADDER, GAIN_PARTS
    he = GAIN_LADDER.index(_HE_ROW)
    return (*GAIN_LADDER[:he], *GAIN_LADDER[he + 1 :]), (*GAIN_PARTS[: he - 1], CACHE_POLICY)


def _speedup(a: str, b: str, latency: dict[str, float]) -> float | None:
    """Return row ``a``'s mean latency over row ``b``'s, ``None`` if either did not run."""
    return ratio(latency[a], latency[b]) if a in latency and b in latency else None


def _measured_part(
    ladder: Sequence[str], names: Sequence[str], a: int, b: int, latency: dict[str, float]
) -> GainPart:
    """Return steps ``a..b-1`` as one part, between ladder rows ``a`` and ``b`` (both ran);
    it names the rows that would split it (``he:workflow`` for the cache policy)."""
    missing = tuple(ladder[a + 1 : b])
    if CACHE_POLICY in names[a:b]:
        missing += (_HE_ROW,)
    name = " + ".join(names[a:b])
    return GainPart(name, ladder[a], ladder[b], _speedup(ladder[a], ladder[b], latency), missing)


def _unmeasured_part(
    ladder: Sequence[str], names: Sequence[str], i: int, latency: dict[str, float]
) -> GainPart:
    """Return step ``i`` as not measured, naming which of its two rows did not run."""
    rows = (ladder[i], ladder[i + 1])
    return GainPart(names[i], *rows, None, tuple(r for r in rows if r not in latency))


def comparison_table(
    results: Sequence[PolicyResult],
    title: str,
    time_unit: str = "s",
    bounds: Bounds | None = None,
) -> RenderableType:
    """Build the comparison: the policy rows' table, then what won and the gain's
    decomposition (:func:`gain_report`), then, with ``bounds``, the bounds apart
    (:func:`bounds_table`); all within :data:`TABLE_WIDTH` columns.

    Args:
        results: one bench's rows, in the order to show them.
        title: the table's title.
        time_unit: the latencies' unit, for the headers.
        bounds: the workload's bounds (the sim bench's), or ``None``.
    """
    blocks = [
        policy_table(results, title, time_unit),
        Text(tail_line(results, time_unit), overflow="fold"),
        gain_report(results, time_unit),
    ]
    if bounds is not None:
        blocks.append(bounds_table(results, bounds, time_unit))
        if any(r.min_gpu_hit_rate == r.min_gpu_hit_rate for r in results):  # not all nan
            blocks.append(Text(min_per_row_line(results), overflow="fold"))
    spaced = [item for block in blocks for item in (Text(), Constrain(block, TABLE_WIDTH))]
    return Group(*spaced[1:])


def policy_table(results: Sequence[PolicyResult], title: str, time_unit: str = "s") -> Table:
    """Build the table of policy rows: latencies, hit rates, work, speedups, ends.

    Speedup is the mean workflow latency of the ``vs lru`` row (the first ``lru`` row,
    else the first row: :func:`~pbkv.bench.compare.baseline_result`) or of the strongest
    baseline (:func:`strongest_baseline`) over the row's. ``recomputed tok`` counts the
    prompt tokens prefilled; ``retracted`` (shown when a row retracted) the running
    requests paused to admit another (§7.0); ``ends`` the workflows by end reason. The
    predictor is named once, in the caption (one per bench). The name column folds
    before the table outgrows :data:`TABLE_WIDTH`.
    """
    base, strongest = baseline_result(results), strongest_baseline(results)
    base_header = "vs lru" if base.policy == "lru" else "vs 1st"
    columns = [
        (f"mean\nlat {time_unit}", lambda r: figure_text(r.mean_latency_s)),
        (f"p99\nlat {time_unit}", lambda r: figure_text(r.p99_latency_s)),
        (f"mean\nTTFT {time_unit}", lambda r: figure_text(r.mean_ttft_s, 3)),
        ("GPU\nhit%", lambda r: f"{100 * r.gpu_hit_rate:.1f}"),
        ("host\nhit%", lambda r: f"{100 * r.host_hit_rate:.1f}"),
        ("recomputed\ntok", lambda r: f"{r.recomputed_tokens:,}"),
        (f"speedup\n{base_header}", lambda r: ratio_text(base.mean_latency_s, r.mean_latency_s)),
        ("speedup\nvs best", lambda r: _speedup_text(strongest, r)),
        ("retracted", lambda r: f"{r.retractions:,}"),
        (END_COLUMN, lambda r: "/".join(str(r.end_reasons.get(e, 0)) for e in END_REASONS)),
    ]
    if not any(r.retractions for r in results):
        columns = [c for c in columns if c[0] != "retracted"]
    table = _plain_table(title, _policy_caption(results, base, strongest, base_header))
    table.add_column("policy:scheduler", overflow="fold")
    for header, _ in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for r in results:
        table.add_row(row_name(r), *(cell(r) for _, cell in columns))
    return table


def _plain_table(title: str, caption: str | None = None) -> Table:
    """Return an empty table framed as every bench block is: a rule under the header, two
    spaces between columns, title and caption left-aligned but the policy table's."""
    return Table(
        title=title,
        caption=caption,
        title_justify="center" if caption else "left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 0, 0, 1),
    )


def _speedup_text(reference: PolicyResult | None, r: PolicyResult) -> str:
    """Return ``reference``'s mean latency over ``r``'s, ``"n/a"`` without a reference."""
    return "n/a" if reference is None else ratio_text(reference.mean_latency_s, r.mean_latency_s)


def _policy_caption(
    results: Sequence[PolicyResult],
    base: PolicyResult,
    strongest: PolicyResult | None,
    base_header: str,
) -> str:
    """Say what the speedups are against, what the columns count, and the predictor."""
    best = "no baseline row" if strongest is None else row_name(strongest)
    caption = (
        f"speedup: {base_header} is {row_name(base)}'s mean latency over the row's; "
        f"vs best is the strongest baseline's ({best}: the fastest row not pbkv's); "
        "hit%: prompt tokens served from the GPU / host tier; "
        "ends: end/recursion_limit/error/aborted"
    )
    forecasting = [r for r in results if r.predictor != "-"]
    predictors = dict.fromkeys(r.predictor for r in forecasting)
    for name in predictors:
        rows = ", ".join(row_name(r) for r in forecasting if r.predictor == name)
        caption += f"; predictor {name} ({rows})"
    return caption


def gain_report(results: Sequence[PolicyResult], time_unit: str = "s") -> RenderableType:
    """Say what won, then the gain over ``lru:fcfs`` by part (:func:`gain_decomposition`),
    each with its rows, or the rows it lacks; one line when no two ladder rows ran."""
    gains = gain_decomposition(results)
    verdict = Text(won_text(results, time_unit))
    if not any(part.speedup is not None for part in gains.parts):
        return Group(
            verdict,
            Text(
                f"gain by part: needs the rows {', '.join(GAIN_LADDER[:3])} and "
                f"{GAIN_LADDER[-1]} ({_HE_ROW} splits the cache policy)"
            ),
        )
    table = _plain_table(f"the gain over {gains.reference}, by part (latency ratios)")
    table.add_column("part", max_width=len(CACHE_POLICY))  # joined parts a line each
    table.add_column("speedup", justify="right", no_wrap=True)
    table.add_column("rows")
    table.add_column("what it is")
    for part in gains.parts:
        table.add_row(*_part_cells(part))
    if gains.total_speedup is not None and len(gains.parts) > 1:
        table.add_row(
            "= total",
            ratio_text(gains.total_speedup, 1.0),
            f"{gains.reference} -> {gains.target}",
            "the product of the parts",
        )
    for aside in gains.asides:
        table.add_row(aside.name, *_part_cells(aside)[1:3], "aside: not in the product")
    return Group(verdict, table)


def _part_cells(part: GainPart) -> tuple[str, str, str, str]:
    """Return a part's name, speedup, rows, and what it is or which rows it lacks."""
    rows = f"{part.from_row} -> {part.to_row}"
    missing = ", ".join(part.missing)
    if part.speedup is None:
        return part.name, "n/a", rows, f"not measured: needs {missing}"
    if " + " in part.name:
        return part.name, ratio_text(part.speedup, 1.0), rows, f"{missing} would split it"
    note = _PART_NOTES.get(part.name, "")
    if part.missing:
        note += f"; {missing} splits it"
    return part.name, ratio_text(part.speedup, 1.0), rows, note


def won_text(results: Sequence[PolicyResult], time_unit: str = "s") -> str:
    """Say which row was fastest, and by how much it beat the strongest baseline and lru
    (or, when a baseline won, where the best pbkv row stands against it)."""
    fastest, strongest = fastest_result(results), strongest_baseline(results)
    if fastest is None:
        return "won: no row measured a workflow latency"
    base = baseline_result(results)
    won = f"won: {row_name(fastest)} ({figure_text(fastest.mean_latency_s)} {time_unit})"
    if strongest is None:
        return f"{won}; no baseline row to compare with"
    if strongest is fastest:
        best_pbkv = fastest_result([r for r in results if is_pbkv(r)])
        if best_pbkv is None:
            return f"{won}, a baseline; no pbkv row"
        against = ratio_text(strongest.mean_latency_s, best_pbkv.mean_latency_s)
        return f"{won}, a baseline; the best pbkv row, {row_name(best_pbkv)}: {against}"
    over = ratio_text(strongest.mean_latency_s, fastest.mean_latency_s)
    text = f"{won}: {over} over the strongest baseline, {row_name(strongest)}"
    if base is not strongest and base is not fastest:
        text += f"; {ratio_text(base.mean_latency_s, fastest.mean_latency_s)} over {row_name(base)}"
    return text


def bounds_table(results: Sequence[PolicyResult], bounds: Bounds, time_unit: str = "s") -> Table:
    """Build the bounds block: what no policy beats on this workload, apart from the
    policy rows, with the headroom the ``vs lru`` row and the fastest row leave.

    Headroom is the bound's hit rate over the row's, or the row's mean latency over the
    bound's (1.000x: at the bound). ``uncontested`` is a reference, not a bound
    (:class:`~pbkv.bench.compare.Bounds`).
    """
    b = bounds
    base = baseline_result(results)
    fastest = fastest_result(results)
    rows = [base] if fastest is None or fastest is base else [base, fastest]
    table = _plain_table("bounds, not policies: what no row beats on this workload")
    table.add_column("bound", no_wrap=True)
    table.add_column("measure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for r in rows:
        table.add_column(f"headroom\n{row_name(r)}", justify="right", overflow="fold")
    table.add_column("what it is")
    hits = (
        ("ceiling", "total hit%", b.ceiling_hit_rate, "total_hit_rate",
         "infinite cache, any order of the requests"),
        ("MIN", "GPU hit%", b.min_hit_rate, "gpu_hit_rate",
         f"exact offline over each row's own access order (value: "
         f"{b.min_order}'s); bounds demand policies"),
        ("MIN", "total hit%", b.min_total_hit_rate, "total_hit_rate",
         "the same at GPU + host capacity; bounds every row"),
    )  # fmt: skip
    for name, measure, rate, field, what in hits:
        if name == "MIN":  # each row against MIN over its own order
            own = "min_gpu_hit_rate" if field == "gpu_hit_rate" else "min_total_hit_rate"
            room = (ratio_text(_measured(getattr(r, own), rate), getattr(r, field)) for r in rows)
        else:
            room = (ratio_text(rate, getattr(r, field)) for r in rows)
        table.add_row(name, measure, f"{100 * rate:.1f}", *room, what)
    latencies = (
        ("floor", b.floor_latency_s, "no run on this cost model is faster: each workflow "
         "alone with every shared block cached, and the GPU's throughput"),
        ("uncontested", b.uncontested_latency_s, f"a reference, not a bound: {FLOOR_SPEC} "
         "with a GPU tier that holds everything"),
    )  # fmt: skip
    for name, latency_s, what in latencies:
        room = (ratio_text(r.mean_latency_s, latency_s) for r in rows)
        table.add_row(name, f"mean lat {time_unit}", figure_text(latency_s), *room, what)
    return table


def tail_line(results: Sequence[PolicyResult], time_unit: str = "s") -> str:
    """Say each row's median and worst latency, throughput and (with an SLO) goodput."""
    parts = []
    for r in results:
        text = (
            f"{row_name(r)} {figure_text(r.p50_latency_s)}/{figure_text(r.max_latency_s)} "
            f"{time_unit}, {r.throughput_workflows_per_s:.4g} wf/{time_unit}"
        )
        if r.goodput_workflows_per_s == r.goodput_workflows_per_s:  # an SLO was given
            text += f", goodput {r.goodput_workflows_per_s:.4g}"
        parts.append(text)
    return "p50/max latency, throughput (goodput within the SLO): " + "; ".join(parts)


def _measured(value: float, otherwise: float) -> float:
    return otherwise if value != value else value  # nan: not measured for this row


def min_per_row_line(results: Sequence[PolicyResult]) -> str:
    """Say each row's MIN over its own access order (GPU / total hit%), beside its hits."""
    parts = [
        f"{row_name(r)} {100 * r.min_gpu_hit_rate:.1f}/{100 * r.min_total_hit_rate:.1f} "
        f"(row {100 * r.gpu_hit_rate:.1f}/{100 * r.total_hit_rate:.1f})"
        for r in results
        if r.min_gpu_hit_rate == r.min_gpu_hit_rate  # measured (not nan)
    ]
    return "MIN over each row's own order, GPU/total hit%: " + "; ".join(parts)


def gpu_tier_note(run: BenchRun, config: BenchConfig) -> str:
    """Say how the GPU tier was sized, and whether the profile capped it."""
    how = (
        "as given (--gpu-kv-tokens)"
        if config.gpu_kv_tokens is not None
        else "default: half the concurrent working set"
    )
    if run.gpu_kv_capped:
        return (
            f"GPU KV tier {run.gpu_kv_tokens:,} tokens: CAPPED by {config.hardware} x "
            f"{config.model}'s KV capacity ({run.profile_kv_tokens:,}); {how} was "
            f"{run.wanted_gpu_kv_tokens:,}"
        )
    return (
        f"GPU KV tier {run.gpu_kv_tokens:,} tokens, {how}; the profile holds "
        f"{run.profile_kv_tokens:,}"
    )


def sim_cost_line(results: Sequence[PolicyResult]) -> str:
    """Say what each row's simulation cost, as this process's CPU seconds
    (``PolicyResult.cpu_s``), with its ratio to the baseline row's (the first ``lru``
    row, else the first), so a policy's and a scheduler's cost are read side by side
    from one run (the target: pbkv's within 1.5x lru's on the same workload)."""
    base = baseline_result(results)
    parts = [
        f"{r.policy}:{r.scheduler} {r.cpu_s:.2f} s ({ratio_text(r.cpu_s, base.cpu_s)})"
        for r in results
    ]
    return "simulation CPU (ratio to " + f"{base.policy}:{base.scheduler}): " + "; ".join(parts)


def result_record(r: PolicyResult, *, timeline: bool = True) -> dict[str, object]:
    """Return one policy result as a JSON-ready mapping (KV statistics included).

    ``timeline=False`` leaves out the per-invocation hit timeline (large; sweeps don't
    plot it).
    """
    fields = (f.name for f in dataclasses.fields(r))
    return {name: getattr(r, name) for name in fields if timeline or name != "hit_timeline"}


def command_line(argv: Sequence[str] | None) -> str:
    """Return the command that reproduces a run: ``pbkv`` and its arguments ``argv``."""
    if not argv:
        return ""
    return " ".join(["pbkv", *(shlex.quote(a) for a in argv)])


def write_json(
    path: str | Path,
    config: BenchConfig,
    gpu_kv_tokens: int,
    results: Sequence[PolicyResult],
    argv: Sequence[str] | None = None,
    run: BenchRun | None = None,
) -> None:
    """Write the command, config, GPU capacity used, every result, the gain by part
    (``decomposition``: :func:`gain_decomposition`) and the bounds as JSON.

    With ``run``, adds the top-level ``bounds`` object and how the GPU tier was sized
    (``wanted_gpu_kv_tokens``, ``profile_kv_tokens``, ``gpu_kv_capped``).
    """
    payload: dict[str, object] = {
        "kind": "bench",
        "command": command_line(argv),
        "config": config,
        "gpu_kv_tokens": gpu_kv_tokens,
        "results": [result_record(r) for r in results],
        "decomposition": gain_decomposition(results),
    }
    if run is not None:
        payload["wanted_gpu_kv_tokens"] = run.wanted_gpu_kv_tokens
        payload["profile_kv_tokens"] = run.profile_kv_tokens
        payload["gpu_kv_capped"] = run.gpu_kv_capped
        payload["bounds"] = run.bounds
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))


def sweep_table(points: Sequence[SweepPoint], title: str) -> RenderableType:
    """Build the sweep: one row per value and policy, speedups against that value's
    ``vs lru`` row and its strongest baseline (as :func:`policy_table`), and, apart, the
    bounds at each value; within :data:`TABLE_WIDTH` columns."""
    table = _plain_table(title, _SWEEP_CAPTION)
    table.add_column(points[0].parameter, justify="right", no_wrap=True)
    table.add_column("policy:scheduler", overflow="fold")
    for header in (
        "mean\nlat s", "mean\nTTFT s", "GPU\nhit%", "host\nhit%", "speedup\nvs lru",
        "speedup\nvs best", "GPU hit\nratio", "spread pp",
    ):  # fmt: skip
        table.add_column(header, justify="right", no_wrap=True)
    for k, p in enumerate(points):
        if k:
            table.add_section()
        base, strongest = baseline_result(p.results), strongest_baseline(p.results)
        for i, r in enumerate(p.results):
            table.add_row(
                f"{p.value:g}" if i == 0 else "",
                row_name(r),
                figure_text(r.mean_latency_s),
                figure_text(r.mean_ttft_s, 3),
                f"{100 * r.gpu_hit_rate:.1f}",
                f"{100 * r.host_hit_rate:.1f}",
                ratio_text(base.mean_latency_s, r.mean_latency_s),
                _speedup_text(strongest, r),
                ratio_text(r.gpu_hit_rate, base.gpu_hit_rate),
                f"{100 * p.hit_rate_spread:.1f}" if i == 0 else "",
            )
    blocks: list[RenderableType] = [table]
    if any(p.bounds is not None for p in points):
        blocks += [Text(), sweep_bounds_table(points)]
    return Group(*(Constrain(block, TABLE_WIDTH) for block in blocks))


_SWEEP_CAPTION = (
    "speedup: vs lru is the value's first lru row's mean latency over the row's, vs best "
    "the fastest row's not pbkv's; GPU hit ratio: over the lru row's; spread: best minus "
    "worst GPU hit rate"
)


def sweep_bounds_table(points: Sequence[SweepPoint]) -> Table:
    """Build the sweep's bounds, apart from its policy rows: at each value, MIN's GPU hit
    rate, the ceiling, the latency floor, and the headroom the floor leaves the ``vs lru``
    row and the fastest row (their mean latency over it)."""
    table = _plain_table("bounds, not policies: what no row beats at each value")
    table.add_column(points[0].parameter, justify="right", no_wrap=True)
    for header in ("MIN\nGPU hit%", "ceiling\ntotal hit%", "floor\nlat s"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("floor headroom\nof the vs lru row", justify="right")
    table.add_column("floor headroom\nof the fastest row", justify="right")
    for p in points:
        b = p.bounds
        if b is None:
            continue
        base, fastest = baseline_result(p.results), fastest_result(p.results)
        table.add_row(
            f"{p.value:g}",
            f"{100 * b.min_hit_rate:.1f}",
            f"{100 * b.ceiling_hit_rate:.1f}",
            figure_text(b.floor_latency_s),
            f"{ratio_text(base.mean_latency_s, b.floor_latency_s)} {row_name(base)}",
            "n/a" if fastest is None else (
                f"{ratio_text(fastest.mean_latency_s, b.floor_latency_s)} {row_name(fastest)}"
            ),
        )  # fmt: skip
    return table


def write_sweep_json(
    path: str | Path,
    config: BenchConfig,
    points: Sequence[SweepPoint],
    argv: Sequence[str] | None = None,
) -> None:
    """Write the command, config and each point's results and gain by part as JSON."""
    payload = {
        "kind": "sweep",
        "command": command_line(argv),
        "config": config,
        "parameter": points[0].parameter,
        "points": [
            {
                "value": p.value,
                "gpu_kv_tokens": p.gpu_kv_tokens,
                "hit_rate_spread": p.hit_rate_spread,
                "bounds": p.bounds,
                "results": [result_record(r, timeline=False) for r in p.results],
                "decomposition": gain_decomposition(p.results),
            }
            for p in points
        ],
    }
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))
