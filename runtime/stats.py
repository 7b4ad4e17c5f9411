"""Per-actor counters and the frozen statistics record built from them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ActorCounters", "ActorState", "ActorStatistics"]


class ActorState(StrEnum):
    """Where an actor is in its life."""

    NEW = "new"
    """Created, not started yet."""
    RUNNING = "running"
    """``on_start`` returned; processing its mailbox."""
    STOPPED = "stopped"
    """Mailbox closed and drained, ``on_stop`` returned."""
    FAILED = "failed"
    """Stopped by its supervisor after a failure."""
    CANCELLED = "cancelled"
    """Cancelled from outside (e.g. another actor's failure tore the system down)."""


@dataclass(slots=True)
class ActorCounters:
    """Live, mutable counters of one actor, updated by its loop and its supervisor.

    Internal to the runtime; read them through ``statistics()``, a frozen snapshot.
    """

    processed: int = 0
    ask_errors: int = 0
    failures: int = 0
    restarts: int = 0
    handler_time_s: float = 0.0
    state: ActorState = ActorState.NEW


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    """A snapshot of one actor's statistics.

    Attributes:
        name: the actor's name.
        state: where the actor is in its life.
        processed: messages handed to ``handle`` (whether it returned or raised).
        mailbox_depth: messages waiting in the mailbox now.
        mailbox_high_water: the most messages ever waiting in the mailbox at once.
        mailbox_capacity: the mailbox bound; ``tell`` blocks while this many are waiting.
        dropped: ``try_tell`` messages dropped because the mailbox was full.
        discarded: queued messages thrown away because the actor stopped after a failure.
        ask_errors: ``ask`` handlers that raised (the error went back to the asker).
        failures: exceptions that escaped the actor to its supervisor.
        restarts: times the supervisor restarted the actor.
        handler_time_s: total wall-clock seconds spent in ``handle``, measured with
            ``time.perf_counter()`` so benchmarks see real work even under ``MockClock``; this
            is the only reading in the runtime that does not come from ``clock.now_s()``.
    """

    name: str
    state: ActorState
    processed: int
    mailbox_depth: int
    mailbox_high_water: int
    mailbox_capacity: int
    dropped: int
    discarded: int
    ask_errors: int
    failures: int
    restarts: int
    handler_time_s: float
