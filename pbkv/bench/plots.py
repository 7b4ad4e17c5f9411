"""PNG plots of comparisons and sweeps (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pbkv.bench.figures import ratio  # noqa: E402
from pbkv.bench.results import PolicyResult, baseline_result  # noqa: E402
from pbkv.bench.sweeps import SweepPoint  # noqa: E402


def plot_sweep(points: Sequence[SweepPoint], path: str | Path, title: str) -> None:
    """Plot GPU hit rate and latency speedup vs lru (or the first policy) per policy."""
    policies = [r.policy for r in points[0].results]
    xs = [p.value for p in points]
    fig, (ax_hit, ax_speed) = plt.subplots(1, 2, figsize=(11, 4))
    for i, policy in enumerate(policies):
        hits = [100 * p.results[i].gpu_hit_rate for p in points]
        speed = [
            ratio(baseline_result(p.results).mean_latency_s, p.results[i].mean_latency_s)
            for p in points
        ]
        ax_hit.plot(xs, hits, marker="o", label=policy)
        ax_speed.plot(xs, speed, marker="o", label=policy)
    parameter = points[0].parameter
    ax_hit.set(xlabel=parameter, ylabel="GPU hit rate (%)", title="GPU hit rate")
    ax_speed.set(
        xlabel=parameter,
        ylabel=f"speedup vs {baseline_result(points[0].results).policy}",
        title="mean workflow latency speedup",
    )
    ax_speed.ticklabel_format(axis="y", useOffset=False)
    if parameter != "noise":  # concurrency and K are whole numbers
        for ax in (ax_hit, ax_speed):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_hit, ax_speed):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_hit_timeline(
    results: Sequence[PolicyResult], path: str | Path, title: str, window: int = 50
) -> None:
    """Plot per-invocation GPU hit rate over simulated time, moving average (paper Fig. 6)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        if not r.hit_timeline:
            continue
        t, hit = np.array(r.hit_timeline).T
        w = max(1, min(window, len(hit)))
        smooth = np.convolve(hit, np.ones(w) / w, mode="valid")
        ax.plot(t[w - 1 :], 100 * smooth, label=r.policy)
    ax.set(xlabel="simulated time (s)", ylabel=f"GPU hit rate (%), {window}-invocation mean")
    ax.set_title(title.replace(", GPU KV", ",\nGPU KV"), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
