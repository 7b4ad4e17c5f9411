"""Seeded random draws the generated apps share: streams, lengths, gaps and cue tiers."""

from __future__ import annotations

import numpy as np


def spawn_rngs(seed: int, index: int, n_streams: int) -> list[np.random.Generator]:
    """Return ``n_streams`` independent generators for workflow ``index`` of ``seed``.

    Stream ``k`` is the same whatever ``n_streams`` is, and depends only on
    ``(seed, index)``, so a workflow does not depend on the others of its workload.
    """
    children = np.random.SeedSequence([seed, index]).spawn(n_streams)
    return [np.random.default_rng(child) for child in children]


def draw_tokens(rng: np.random.Generator, bounds: tuple[int, int], bonus: float = 0.0) -> int:
    """Return a length uniform in ``bounds`` (both included) plus ``int(bonus)``."""
    low, high = bounds
    return int(rng.integers(low, high + 1)) + int(bonus)


def draw_gap_s(rng: np.random.Generator, bounds_s: tuple[float, float]) -> float:
    """Return a tool/think time uniform in ``bounds_s``, rounded to milliseconds."""
    return round(float(rng.uniform(*bounds_s)), 3)


def noisy_tier(rng: np.random.Generator, difficulty: float) -> int:
    """Return the cue tier (0 easy, 1 medium, 2 hard) of ``difficulty`` plus noise (sd 0.15)."""
    noisy = difficulty + rng.normal(0.0, 0.15)
    return 0 if noisy < 0.35 else 1 if noisy < 0.7 else 2
