"""The runtime's single source of time.

Every timestamp in pbkv comes from :func:`now_s`, so a ``trio.testing.MockClock`` drives the
whole system in virtual time. (The one exception is the wall-clock handler time in actor
statistics, which exists to benchmark real work.)
"""

from __future__ import annotations

import trio

__all__ = ["now_s"]


def now_s() -> float:
    """Return the current time of the running trio clock, in seconds.

    Returns:
        ``trio.current_time()``: virtual seconds under ``MockClock``, otherwise a monotonic
        clock with an arbitrary origin.

    Raises:
        RuntimeError: if called outside a running trio event loop.
    """
    return float(trio.current_time())
