"""Running an app's async entry point: under trio, in virtual time on the sim engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing


def run(main: Callable[..., Awaitable[object]], engine: str = "torch", *args: str) -> object:
    """Run ``main(engine, *args)`` under trio and return what it returns.

    With ``engine="sim"`` the run is in virtual time: trio's ``MockClock`` jumps ahead
    whenever every task waits (``autojump_threshold=0``), so a simulated workload of
    minutes takes what its bookkeeping costs. Any other engine runs on the wall clock.

    Args:
        main: an async function taking the engine name, then ``args``.
        engine: ``"sim"``, ``"torch"`` or another name :func:`pbkv.open_runtime` knows.
        args: passed on (e.g. a model name).

    Raises:
        Whatever ``main`` raises.
    """
    clock = trio.testing.MockClock(autojump_threshold=0) if engine == "sim" else None
    return trio.run(main, engine, *args, clock=clock)
