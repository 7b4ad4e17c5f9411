"""Render policy comparisons: the terminal table and the JSON file (§9)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
from rich.table import Table

from pbkv.bench.compare import BenchConfig, PolicyResult


def ratio(value: float, baseline: float) -> float:
    """Return ``value / baseline`` (``nan`` when the baseline is zero)."""
    return value / baseline if baseline else float("nan")


def comparison_table(results: Sequence[PolicyResult], title: str, time_unit: str = "s") -> Table:
    """Build the comparison table: one row per policy, ratios against ``lru``.

    Speedup is lru's mean workflow latency over the policy's; the hit-rate ratio is the
    policy's GPU hit rate over lru's. Without an ``lru`` row the first row is the baseline.
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
        "failed",
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
            f"{ratio(base.mean_latency_s, r.mean_latency_s):.3f}x",
            f"{ratio(r.gpu_hit_rate, base.gpu_hit_rate):.3f}x",
            str(r.failed_workflows),
        )
    return table


def write_json(
    path: str | Path, config: BenchConfig, gpu_kv_tokens: int, results: Sequence[PolicyResult]
) -> None:
    """Write the config, the GPU capacity used and every result (with KV statistics) as JSON."""
    payload = {
        "config": config,
        "gpu_kv_tokens": gpu_kv_tokens,
        "results": [
            {
                **{
                    f: getattr(r, f)
                    for f in r.__dataclass_fields__
                    if f not in ("kv", "hit_timeline")
                },
                "kv": r.kv,
                "hit_timeline": r.hit_timeline,
            }
            for r in results
        ],
    }
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))
