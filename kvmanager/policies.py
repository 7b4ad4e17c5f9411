"""Cache policies by name: eviction order and prefetch mode (§5.2).

A policy is a small record that gives each node a priority (the smallest is evicted
first, as SGLang's eviction strategies do) and says whether and how to prefetch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from math import remainder
from typing import Literal

from pbkv.kvmanager.eviction import Priority
from pbkv.kvmanager.node import Node

PrefetchMode = Literal["none", "conservative", "aggressive", "next-fixed"]
Tracker = Literal["none", "kvflow", "belady", "continuum", "survival"]

# Scores are sums of float products refreshed incrementally; rounding keeps nodes with
# equal true scores tied (so LRU breaks the tie) despite last-bit drift.
_SCORE_DIGITS = 12
_SCALE = 1e12  # 10**_SCORE_DIGITS, exact in binary64
_SCALED_BOUND = 2.0**46  # below it, half an ulp of x * _SCALE is at most 2**-8
_NEG_SCALED_BOUND = -_SCALED_BOUND


def rounded_score(x: float) -> float:
    """Return ``round(x, 12)``, bit for bit, mostly without its decimal conversion.

    ``round(x, 12)`` is the double nearest ``N / 10**12``, ``N`` the integer nearest
    ``x * 10**12`` (ties to even), computed through a decimal string. When
    ``y = x * 1e12`` (one rounding, at most ``2**-8`` off below :data:`_SCALED_BOUND`)
    lies within 0.49 of an integer ``n != 0``, the exact product lies within 0.5 of
    ``n``, so ``N = n``, and ``n / 1e12`` (``n`` exact as a double, one correctly
    rounded division) is that nearest double. Anything else (near a tie, zero, whose
    sign ``round`` keeps, very large, not finite) goes to ``round`` itself.

    ``n`` comes from ``r = math.remainder(y, 1.0)``, IEEE 754's remainder: exactly
    ``y - n`` for the integer ``n`` nearest ``y`` (ties to even, as ``round(y)``), so
    ``y - r`` is ``n`` exactly and ``n != 0`` reads ``r != y``; no integer is made.
    """
    y = x * _SCALE
    if _NEG_SCALED_BOUND < y < _SCALED_BOUND:
        r = remainder(y, 1.0)
        if -0.49 < r < 0.49 and r != y:
            return (y - r) / _SCALE
    return round(x, _SCORE_DIGITS)


def lru_priority(node: Node) -> Priority:
    """Least recently used first (SGLang/vLLM default)."""
    return (node.last_access_s,)


def lae_priority(node: Node) -> Priority:
    """Retired cache first, then least recently used (PBKV-LAE)."""
    return (not node.retired, node.last_access_s)


def score_priority(node: Node) -> Priority:
    """Retired first, then ascending ``Score(c)`` (paper Eq. 2), LRU as tie-break (PBKV-HE)."""
    return (not node.retired, rounded_score(node.score), node.last_access_s)


SCORE_BAND_RATIO = 1.1
"""Scores within this factor of each other rank as equals in pbkv's key (one band of
:func:`score_band`), and the oldest workflow's cache stays. A score is a sum of
forecast probabilities over steps; differences of a few percent between two
workflows' contexts (per-workflow forecast-miss weights, a markov state a step apart)
say nothing about which is reused first, whereas the ``workflow`` scheduler admits the
oldest workflow first, so its context is reused first. Ranking such scores exactly let
those differences decide, so a young workflow's queued prefix (score + 1) outranked an
older workflow's context between two of its tool calls, which came back sooner and
went first (figures behind 1.1: ``docs/design.md``)."""
_LOG_BAND = math.log(SCORE_BAND_RATIO)
NO_REUSE_BAND = -(1 << 30)
"""The band of a score of 0 (or below, by rounding): below every positive score's."""


def score_band(value: float) -> int:
    """Return ``floor(log(value) / log(SCORE_BAND_RATIO))``, the band of a positive
    score; :data:`NO_REUSE_BAND` for ``value <= 0``."""
    return math.floor(math.log(value) / _LOG_BAND) if value > 0.0 else NO_REUSE_BAND


def workflow_priority(node: Node) -> Priority:
    """PBKV with the queue: retired first, then ascending ``Score(c)`` plus one per queued
    request whose cached prefix runs through the node (a certain next use), in bands
    of :data:`SCORE_BAND_RATIO`; within a band the youngest workflow's cache first,
    then the lower score, LRU last.

    Ranking near-equal scores by workflow age (the order the ``workflow`` scheduler
    admits in) keeps the oldest workflows' contexts resident instead of cycling every
    context out just before its reuse, as LRU does when the running set's contexts do
    not fit.
    """
    # rounded_score(node.score + node.queued), its common case inline (a call per re-key)
    y = (node.score + node.queued) * _SCALE
    value = None
    if _NEG_SCALED_BOUND < y < _SCALED_BOUND:
        r = remainder(y, 1.0)
        if -0.49 < r < 0.49 and r != y:
            value = (y - r) / _SCALE
    if value is None:
        value = rounded_score(node.score + node.queued)
    return (not node.retired, score_band(value), -node.oldest, value, node.last_access_s)


def kvflow_priority(node: Node) -> Priority:
    """KVFlow: dynamic suffixes first (LRU), then fixed prefixes by descending
    steps-to-execution (``node.hint``), LRU last."""
    fixed = bool(node.fixed_agents)
    return (fixed, -node.hint if fixed else 0.0, node.last_access_s)


def belady_priority(node: Node) -> Priority:
    """Belady-est: farthest *estimated* next use (``node.hint``, in seconds) first, LRU as
    tie-break. An estimate, not a bound: the exact offline MIN is
    :func:`pbkv.kvmanager.bounds.min_hits`."""
    return (-node.hint, node.last_access_s)


def survival_priority(node: Node) -> Priority:
    """Markov-survival: ascending probability that a workflow holding the node survives
    to invoke an agent that touched it (``node.hint``, kept by
    :class:`~pbkv.kvmanager.survival.SurvivalTracker`; retired nodes, held by none, have
    0 and go first), LRU as tie-break."""
    return (not node.retired, node.hint, node.last_access_s)


@dataclass(frozen=True, slots=True)
class Policy:
    """A named cache policy.

    Attributes:
        name: registry name.
        priority: eviction key; smallest first.
        uses_forecasts: needs the predictor's K-step forecasts (Score).
        prefetch: ``none``, ``conservative`` (§5.4: free and retired space only),
            ``aggressive`` (may displace active cache scored below the candidate) or
            ``next-fixed`` (KVFlow: next-step agents' fixed prefixes).
        tracker: the baseline state the policy's key reads (``kvflow``: the app's step
            graph; ``belady``: the whole workload in advance, for ``belady-est``;
            ``continuum``: TTL pins, :mod:`pbkv.kvmanager.continuum`; ``survival``: the
            online agent chain, :mod:`pbkv.kvmanager.survival`).
        queue_aware: the key reads ``node.queued`` (queued requests' prefixes), so the
            engine reports its queue (:meth:`KVManager.note_waiting`).
        time_aware: each workflow's share of the score is weighed by when it is back
            from its tool or user (:mod:`pbkv.kvmanager.timing`); needs forecasts.
    """

    name: str
    priority: Callable[[Node], Priority]
    uses_forecasts: bool = False
    prefetch: PrefetchMode = "none"
    tracker: Tracker = "none"
    queue_aware: bool = False
    time_aware: bool = False


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("lru", lru_priority),
        Policy("lae", lae_priority),
        Policy("he", score_priority, uses_forecasts=True),
        Policy(
            "pbkv",
            workflow_priority,
            uses_forecasts=True,
            prefetch="conservative",
            queue_aware=True,
        ),
        Policy(
            "pbkv-timed",
            workflow_priority,
            uses_forecasts=True,
            prefetch="conservative",
            queue_aware=True,
            time_aware=True,
        ),
        Policy(
            "pbkv-aggressive",
            workflow_priority,
            uses_forecasts=True,
            prefetch="aggressive",
            queue_aware=True,
        ),
        Policy("kvflow", kvflow_priority, prefetch="next-fixed", tracker="kvflow"),
        Policy("belady-est", belady_priority, tracker="belady"),
        Policy("continuum", lru_priority, tracker="continuum"),
        Policy("autellix", lru_priority),  # eviction as the engine's; admission: autellix
        Policy("markov-survival", survival_priority, prefetch="conservative", tracker="survival"),
    )
}


def get_policy(name: str) -> Policy:
    """Return the policy registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
