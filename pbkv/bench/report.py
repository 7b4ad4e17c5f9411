"""Render policy comparisons: the terminal table and the JSON file (§9)."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path

import msgspec
from rich.table import Table

from pbkv.bench.compare import END_REASONS, BenchConfig, PolicyResult
from pbkv.bench.sweeps import SweepPoint


def ratio(value: float, baseline: float) -> float:
    """Return ``value / baseline`` (``nan`` when the baseline is zero)."""
    return value / baseline if baseline else float("nan")


def ratio_text(value: float, baseline: float) -> str:
    """Return ``value / baseline`` as ``"1.234x"``, or ``"n/a"`` when the baseline is zero
    (a ratio to nothing; printing ``nanx`` read like a bug)."""
    return f"{value / baseline:.3f}x" if baseline else "n/a"


def comparison_table(results: Sequence[PolicyResult], title: str, time_unit: str = "s") -> Table:
    """Build the comparison table: one row per policy, ratios against ``lru``.

    Speedup is lru's mean workflow latency over the policy's; the hit-rate ratio is the
    policy's GPU hit rate over lru's. Without an ``lru`` row the first row is the baseline.
    The last column counts the workflows by end reason: end / recursion_limit / error /
    aborted.
    """
    base = next((r for r in results if r.policy == "lru"), results[0])
    table = Table(title=title, caption=f"speedup and GPU hit ratio are relative to {base.policy}")
    for name in (
        "policy",
        "predictor",
        f"mean lat {time_unit}",
        f"p99 lat {time_unit}",
        f"mean TTFT {time_unit}",
        "GPU hit%",
        "host hit%",
        "recomputed tok",
        "speedup",
        "GPU hit ratio",
        "end/limit/err/abort",
    ):
        table.add_column(name, justify="left" if name in ("policy", "predictor") else "right")
    for r in results:
        table.add_row(
            r.policy,
            r.predictor,
            f"{r.mean_latency_s:.2f}",
            f"{r.p99_latency_s:.2f}",
            f"{r.mean_ttft_s:.3f}",
            f"{100 * r.gpu_hit_rate:.1f}",
            f"{100 * r.host_hit_rate:.1f}",
            f"{r.recomputed_tokens:,}",
            ratio_text(base.mean_latency_s, r.mean_latency_s),
            ratio_text(r.gpu_hit_rate, base.gpu_hit_rate),
            "/".join(str(r.end_reasons.get(reason, 0)) for reason in END_REASONS),
        )
    return table


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
) -> None:
    """Write the command, config, GPU capacity used and every result as JSON."""
    payload = {
        "kind": "bench",
        "command": command_line(argv),
        "config": config,
        "gpu_kv_tokens": gpu_kv_tokens,
        "results": [result_record(r) for r in results],
    }
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))


def sweep_table(points: Sequence[SweepPoint], title: str) -> Table:
    """Build the sweep table: one row per value and policy, ratios vs lru at that value."""
    table = Table(title=title)
    for name in (
        points[0].parameter,
        "policy",
        "GPU hit%",
        "host hit%",
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
                r.policy,
                f"{100 * r.gpu_hit_rate:.1f}",
                f"{100 * r.host_hit_rate:.1f}",
                f"{r.mean_latency_s:.2f}",
                f"{r.mean_ttft_s:.3f}",
                ratio_text(base.mean_latency_s, r.mean_latency_s),
                ratio_text(r.gpu_hit_rate, base.gpu_hit_rate),
                f"{100 * p.hit_rate_spread:.1f}" if i == 0 else "",
            )
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
                "results": [result_record(r, timeline=False) for r in p.results],
            }
            for p in points
        ],
    }
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))
