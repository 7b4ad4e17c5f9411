"""The runtime's single source of time.

Every timestamp in pbkv comes from :func:`now_s`, so a ``trio.testing.MockClock`` drives the
whole system in virtual time. (The one exception is the wall-clock handler time in actor
statistics, which exists to benchmark real work.)
"""

from __future__ import annotations

import trio

__all__ = ["now_s", "seed_scheduler"]


def now_s() -> float:
    """Return the current time of the running trio clock, in seconds.

    Returns:
        ``trio.current_time()``: virtual seconds under ``MockClock``, otherwise a monotonic
        clock with an arbitrary origin.

    Raises:
        RuntimeError: if called outside a running trio event loop.
    """
    return float(trio.current_time())


def seed_scheduler(seed: int) -> None:
    """Make trio's task scheduling order reproducible for this process.

    Trio shuffles each batch of runnable tasks with a module-level ``random.Random``, and
    the batch itself comes in an order that depends on memory addresses (equal deadlines
    are tie-broken by ``id()``: two agents whose tool calls end at the same virtual
    instant wake in a different order from one process to the next). This does what
    pytest-trio does for Hypothesis: it turns on trio's deterministic scheduling (each
    batch sorted by task creation order before the shuffle) and seeds that RNG, so a
    virtual-time simulation gives the same figures for the same seed in every process.
    (Private trio attributes; checked to exist so a trio change fails loudly.)

    Mutates: trio's module state for the whole process (the sort costs a little per
    scheduler batch).

    Raises:
        RuntimeError: the installed trio lacks either attribute.
    """
    import trio._core._run as trio_run

    rng = getattr(trio_run, "_r", None)
    if rng is None or not hasattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING"):
        raise RuntimeError(
            "this trio version has no deterministic scheduling hooks "
            "(trio._core._run._r / _ALLOW_DETERMINISTIC_SCHEDULING)"
        )
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    rng.seed(seed)
