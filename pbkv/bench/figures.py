"""How a bench writes its numbers: ratios (``nan`` over a zero baseline) and figures,
``n/a`` where nothing was measured."""

from __future__ import annotations

import math


def ratio(value: float, baseline: float) -> float:
    """Return ``value / baseline`` (``nan`` when the baseline is zero)."""
    return value / baseline if baseline else float("nan")


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
