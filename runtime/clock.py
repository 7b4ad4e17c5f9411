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

    Trio breaks ties between runnable tasks (and equal deadlines) with a module-level
    ``random.Random``; pytest-trio seeds the same instance for Hypothesis. Seeding it
    before ``trio.run`` makes a virtual-time simulation give the same figures for the
    same seed. (Private trio attribute; checked to exist so a trio change fails loudly.)

    Raises:
        RuntimeError: the installed trio has no scheduler RNG to seed.
    """
    import trio._core._run as trio_run

    rng = getattr(trio_run, "_r", None)
    if rng is None:
        raise RuntimeError("this trio version has no scheduler RNG (trio._core._run._r)")
    rng.seed(seed)
