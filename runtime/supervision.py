"""Supervision strategies and the restart budget (plain synchronous code)."""

from __future__ import annotations

from collections import deque
from enum import StrEnum

__all__ = ["RestartBudget", "Strategy"]


class Strategy(StrEnum):
    """What a supervisor does when an exception escapes its actor."""

    RESTART = "restart"
    """Call ``on_restart(error)``, then run the actor again on the same mailbox."""
    STOP = "stop"
    """Stop the actor (queued messages discarded, ``on_stop`` called); record the failure."""
    ESCALATE = "escalate"
    """Raise ``ActorFailed`` at once, tearing the actor system down."""

    @classmethod
    def parse(cls, value: Strategy | str) -> Strategy:
        """Return the strategy named ``value``.

        Args:
            value: a ``Strategy`` or its name.

        Returns:
            The matching strategy.

        Raises:
            ValueError: if ``value`` names no strategy; the message lists the known names.
        """
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(repr(s.value) for s in cls)
            raise ValueError(f"unknown strategy {value!r}; known strategies: {known}") from None


class RestartBudget:
    """Allow at most ``max_restarts`` restarts in any window of ``within_s`` seconds.

    Args:
        max_restarts: restarts allowed per window; 0 means the first failure is fatal.
        within_s: the sliding window length, in seconds (virtual time under ``MockClock``).

    Raises:
        ValueError: if ``max_restarts`` is negative or ``within_s`` is not positive.
    """

    def __init__(self, max_restarts: int, within_s: float) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if not within_s > 0:
            raise ValueError(f"within_s must be > 0, got {within_s}")
        self.max_restarts = max_restarts
        self.within_s = within_s
        self._restart_times_s: deque[float] = deque()

    def in_window(self, now_s: float) -> int:
        """Return how many restarts happened in the window ending at ``now_s``.

        Mutates: forgets restarts older than the window.
        """
        while self._restart_times_s and self._restart_times_s[0] <= now_s - self.within_s:
            self._restart_times_s.popleft()
        return len(self._restart_times_s)

    def try_consume(self, now_s: float) -> bool:
        """Spend one restart at ``now_s`` if the budget allows it.

        Args:
            now_s: the current time, from ``clock.now_s()``.

        Returns:
            True if the restart is allowed (and recorded), False if the budget is spent.
        """
        if self.in_window(now_s) >= self.max_restarts:
            return False
        self._restart_times_s.append(now_s)
        return True

    def describe(self) -> str:
        """Return the budget in words, e.g. ``"2 restarts within 60.0 s"``."""
        return f"{self.max_restarts} restarts within {self.within_s} s"
