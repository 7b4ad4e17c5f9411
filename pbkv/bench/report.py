"""Render policy comparisons: the terminal table and the JSON file (§9)."""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Sequence
from pathlib import Path

import msgspec
from rich.table import Table

from pbkv.bench.compare import (
    END_REASONS,
    FLOOR_SPEC,
    BenchConfig,
    BenchRun,
    Bounds,
    PolicyResult,
    baseline_result,
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


def comparison_table(
    results: Sequence[PolicyResult],
    title: str,
    time_unit: str = "s",
    bounds: Bounds | None = None,
) -> Table:
    """Build the comparison table: one row per policy spec, ratios against ``lru``.

    Speedup is lru's mean workflow latency over the policy's; the hit-rate ratios are
    the policy's GPU and total (GPU + host) hit rates over lru's; the recompute ratio is
    the policy's recomputed tokens over lru's (lower is better); ``retracted`` counts
    running requests paused to admit another (§7.0). The baseline is the
    first ``lru`` row, else the first row. The last column counts the workflows by end
    reason: end / recursion_limit / error / aborted. With ``bounds``, a last section
    shows the ceiling, MIN and floor (ratios vs the same baseline).
    """
    base = baseline_result(results)
    vs = f"{base.policy}:{base.scheduler}"
    caption = f"ratios are relative to {vs}; ends: end/recursion_limit/error/aborted"
    if bounds is not None:
        caption += (
            f"; ceiling: infinite cache, any order; MIN: exact offline over {bounds.min_order}'s "
            "access order (bounds demand policies); floor: no run on this cost model is faster "
            "(each workflow alone with every shared block cached, and the GPU's throughput); "
            "uncontested: a reference, not a bound (a GPU tier that holds everything, "
            "arrival order)"
        )
    table = Table(title=title, caption=caption)
    headers = (
        "policy:scheduler",
        "predictor",
        f"mean lat {time_unit}",
        f"p99 lat {time_unit}",
        f"mean TTFT {time_unit}",
        "GPU hit%",
        "total hit%",
        "recomputed tok",
        "speedup",
        "GPU hit ratio",
        "total hit ratio",
        "recompute ratio",
        "retracted",
        END_COLUMN,
    )
    rows = [
        (
            f"{r.policy}:{r.scheduler}",
            r.predictor,
            figure_text(r.mean_latency_s),
            figure_text(r.p99_latency_s),
            figure_text(r.mean_ttft_s, 3),
            f"{100 * r.gpu_hit_rate:.1f}",
            f"{100 * r.total_hit_rate:.1f}",
            f"{r.recomputed_tokens:,}",
            ratio_text(base.mean_latency_s, r.mean_latency_s),
            ratio_text(r.gpu_hit_rate, base.gpu_hit_rate),
            ratio_text(r.total_hit_rate, base.total_hit_rate),
            ratio_text(r.recomputed_tokens, base.recomputed_tokens),
            f"{r.retractions:,}",
            "/".join(str(r.end_reasons.get(reason, 0)) for reason in END_REASONS),
        )
        for r in results
    ]
    for i, name in enumerate(headers):
        # a cell is never cut: the numbers' headers stand one word a line instead
        width = max((len(row[i]) for row in rows), default=0)
        if name in ("policy:scheduler", "predictor"):
            table.add_column(name, justify="left", min_width=width, no_wrap=True)
        else:
            table.add_column(
                name.replace(" ", "\n"), justify="right", min_width=width, no_wrap=True
            )
    for row in rows:
        table.add_row(*row)
    if bounds is not None:
        _add_bound_rows(table, base, bounds)
    return table


def _add_bound_rows(table: Table, base: PolicyResult, b: Bounds) -> None:
    """Add the ceiling, MIN, floor and uncontested rows under the policies (columns as
    the table's)."""
    table.add_section()
    blank = ""
    table.add_row(
        "ceiling:any", "inf cache", *[blank] * 4,
        f"{100 * b.ceiling_hit_rate:.1f}", *[blank] * 3,
        ratio_text(b.ceiling_hit_rate, base.total_hit_rate), *[blank] * 3,
    )  # fmt: skip
    table.add_row(
        f"MIN:{b.min_order.partition(':')[2]}", "offline", *[blank] * 3,
        f"{100 * b.min_hit_rate:.1f}", f"{100 * b.min_total_hit_rate:.1f}", *[blank] * 2,
        ratio_text(b.min_hit_rate, base.gpu_hit_rate),
        ratio_text(b.min_total_hit_rate, base.total_hit_rate), *[blank] * 3,
    )  # fmt: skip
    table.add_row(
        "floor:any", "bound", f"{b.floor_latency_s:.2f}", *[blank] * 5,
        ratio_text(base.mean_latency_s, b.floor_latency_s), *[blank] * 5,
    )  # fmt: skip
    table.add_row(
        f"uncontested:{FLOOR_SPEC.partition(':')[2]}", "no evict",
        f"{b.uncontested_latency_s:.2f}", *[blank] * 5,
        ratio_text(base.mean_latency_s, b.uncontested_latency_s), *[blank] * 5,
    )  # fmt: skip


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
    """Write the command, config, GPU capacity used, every result and the bounds as JSON.

    With ``run``, adds the top-level ``bounds`` object and how the GPU tier was sized
    (``wanted_gpu_kv_tokens``, ``profile_kv_tokens``, ``gpu_kv_capped``).
    """
    payload: dict[str, object] = {
        "kind": "bench",
        "command": command_line(argv),
        "config": config,
        "gpu_kv_tokens": gpu_kv_tokens,
        "results": [result_record(r) for r in results],
    }
    if run is not None:
        payload["wanted_gpu_kv_tokens"] = run.wanted_gpu_kv_tokens
        payload["profile_kv_tokens"] = run.profile_kv_tokens
        payload["gpu_kv_capped"] = run.gpu_kv_capped
        payload["bounds"] = run.bounds
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))


def sweep_table(points: Sequence[SweepPoint], title: str) -> Table:
    """Build the sweep table: one row per value and policy, ratios vs lru at that value."""
    table = Table(title=title)
    for name in (
        points[0].parameter,
        "policy",
        "GPU hit%",
        "host hit%",
        "total hit%",
        "mean lat s",
        "mean TTFT s",
        "speedup",
        "GPU hit ratio",
        "spread pp",
    ):
        table.add_column(name, justify="left" if name == "policy" else "right")
    for p in points:
        base = next((r for r in p.results if r.policy == "lru"), p.results[0])
        for i, r in enumerate(p.results):
            table.add_row(
                f"{p.value:g}" if i == 0 else "",
                f"{r.policy}:{r.scheduler}",
                f"{100 * r.gpu_hit_rate:.1f}",
                f"{100 * r.host_hit_rate:.1f}",
                f"{100 * r.total_hit_rate:.1f}",
                f"{r.mean_latency_s:.2f}",
                f"{r.mean_ttft_s:.3f}",
                ratio_text(base.mean_latency_s, r.mean_latency_s),
                ratio_text(r.gpu_hit_rate, base.gpu_hit_rate),
                f"{100 * p.hit_rate_spread:.1f}" if i == 0 else "",
            )
        b = p.bounds
        if b is not None:
            table.add_row(
                "", "MIN / ceiling", f"{100 * b.min_hit_rate:.1f}", "",
                f"{100 * b.ceiling_hit_rate:.1f}", f"{b.floor_latency_s:.2f} floor", "",
                f"{ratio(base.mean_latency_s, b.floor_latency_s):.3f}x", "", "",
            )  # fmt: skip
        table.add_section()
    return table


def write_sweep_json(
    path: str | Path,
    config: BenchConfig,
    points: Sequence[SweepPoint],
    argv: Sequence[str] | None = None,
) -> None:
    """Write the command, config and each point's results as JSON."""
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
            }
            for p in points
        ],
    }
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))
