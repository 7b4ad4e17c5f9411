"""Render policy comparisons in the terminal (§9): the table of rows, what won and the gain
by part, the bounds apart, and a sweep's table; each block within :data:`TABLE_WIDTH`
columns.

The numbers' text is in :mod:`~pbkv.bench.figures`, the gain's split in
:mod:`~pbkv.bench.gains`, the JSON in :mod:`~pbkv.bench.records`; ``__all__`` re-exports
the names other code imports from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.constrain import Constrain
from rich.table import Table
from rich.text import Text

from pbkv.bench.compare import FLOOR_SPEC
from pbkv.bench.config import BenchConfig
from pbkv.bench.figures import figure_text, ratio_text
from pbkv.bench.gains import (
    ADMISSION,
    BATCHING,
    CACHE_POLICY,
    EVICTION,
    GAIN_LADDER,
    HE_ROW,
    PREFETCH,
    GainDecomposition,
    GainPart,
    fastest_result,
    gain_decomposition,
    is_pbkv,
    strongest_baseline,
)
from pbkv.bench.records import result_record, write_json, write_sweep_json
from pbkv.bench.results import (
    END_REASONS,
    BenchRun,
    Bounds,
    PolicyResult,
    baseline_result,
    row_name,
)
from pbkv.bench.sweeps import SweepPoint

__all__ = [
    "END_COLUMN",
    "TABLE_WIDTH",
    "bounds_table",
    "comparison_table",
    "gain_report",
    "gpu_tier_note",
    "min_per_row_line",
    "policy_table",
    "sim_cost_line",
    "sweep_bounds_table",
    "sweep_table",
    "tail_line",
    "won_text",
    # defined elsewhere, imported from here by tests and pbkv.demo
    "GainDecomposition",
    "GainPart",
    "fastest_result",
    "figure_text",
    "gain_decomposition",
    "ratio_text",
    "result_record",
    "strongest_baseline",
    "write_json",
    "write_sweep_json",
]

END_COLUMN = "ends"
"""The table's column counting workflows by end reason: end/limit/error/aborted."""

TABLE_WIDTH = 100
"""Columns a bench table fits in, with the blocks printed under it."""

_PART_NOTES = {
    BATCHING: "stall-free batches (vLLM V1); any engine",
    ADMISSION: "the workflow scheduler's admission order",
    EVICTION: "forecast-scored eviction (he)",
    PREFETCH: "pbkv over he: prefetch, queued prefixes, age",
    CACHE_POLICY: "eviction + prefetch",
}


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
    else the first row: :func:`~pbkv.bench.results.baseline_result`) or of the strongest
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
                f"{GAIN_LADDER[-1]} ({HE_ROW} splits the cache policy)"
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
    (:class:`~pbkv.bench.results.Bounds`).
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
