"""The gain of pbkv over lru split into its parts: batching, admission, eviction and
prefetch, each a latency ratio between two rows of one bench that differ in one thing
(:data:`GAIN_LADDER`), and which rows were fastest."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from itertools import pairwise

from pbkv.bench.figures import ratio
from pbkv.bench.results import PolicyResult, row_name

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


HE_ROW = "he:workflow"


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


def is_pbkv_policy(name: str) -> bool:
    """Return whether a policy name is one of pbkv's (``pbkv`` or ``pbkv-*``)."""
    return name == "pbkv" or name.startswith("pbkv-")


def is_pbkv(result: PolicyResult) -> bool:
    """Return whether a row runs one of pbkv's policies (:func:`is_pbkv_policy`)."""
    return is_pbkv_policy(result.policy)


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
    if HE_ROW in latency:
        return GAIN_LADDER, GAIN_PARTS
    he = GAIN_LADDER.index(HE_ROW)
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
        missing += (HE_ROW,)
    name = " + ".join(names[a:b])
    return GainPart(name, ladder[a], ladder[b], _speedup(ladder[a], ladder[b], latency), missing)


def _unmeasured_part(
    ladder: Sequence[str], names: Sequence[str], i: int, latency: dict[str, float]
) -> GainPart:
    """Return step ``i`` as not measured, naming which of its two rows did not run."""
    rows = (ladder[i], ladder[i + 1])
    return GainPart(names[i], *rows, None, tuple(r for r in rows if r not in latency))
