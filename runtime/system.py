"""The actor system: spawning, the name registry, supervision and ordered shutdown."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from . import clock
from .actor import Actor, ActorRef, TaskStatus
from .errors import ActorFailed, UnknownActor, ungrouped
from .stats import ActorState, ActorStatistics
from .supervision import RestartBudget, Strategy

__all__ = ["ActorSystem", "open_actor_system"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Entry:
    """One registered actor and how it is supervised."""

    actor: Actor
    strategy: Strategy
    budget: RestartBudget
    depends_on: tuple[str, ...]
    done: trio.Event = field(default_factory=trio.Event)
    task: Any = None


class _Readiness:
    """Forward the first ``started()`` to ``nursery.start``; ignore the ones after restarts."""

    def __init__(self, task_status: TaskStatus) -> None:
        self._task_status = task_status
        self.is_started = False

    def started(self, value: Any = None) -> None:
        if not self.is_started:
            self.is_started = True
            self._task_status.started(value)


class ActorSystem:
    """A set of named, supervised actors running in one trio nursery.

    Create it with :func:`open_actor_system`.

    Args:
        nursery: the nursery the actors run in.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._entries: dict[str, _Entry] = {}
        self._failures: list[ActorFailed] = []
        self._fatal: ActorFailed | None = None
        self._closing = False

    async def spawn(
        self,
        actor: Actor,
        *,
        name: str,
        strategy: Strategy | str = Strategy.ESCALATE,
        max_restarts: int = 3,
        within_s: float = 60.0,
        depends_on: Sequence[str] = (),
    ) -> ActorRef:
        """Start ``actor`` under ``name`` and return once its ``on_start`` has returned.

        Args:
            actor: a new actor instance (an instance can be spawned once).
            name: the registry name, unique within the system.
            strategy: what to do when an exception escapes the actor (see ``Strategy``).
            max_restarts: restarts allowed within ``within_s`` seconds (``restart`` only).
            within_s: the restart budget window, in seconds of ``clock.now_s()``.
            depends_on: names of running actors this one uses; they stop after it.

        Returns:
            A ref to the running actor.

        Raises:
            RuntimeError: if the system is shutting down.
            ValueError: if ``name`` is empty or taken, ``actor`` was already spawned, a
                dependency is not running, or a supervision argument is invalid.
            UnknownActor: if a name in ``depends_on`` is not registered.
            ActorFailed: if ``actor`` fails before it is ready and the supervisor gives up.
        """
        if self._closing:
            raise RuntimeError("the actor system is shutting down; cannot spawn")
        entry = self._new_entry(actor, name, strategy, max_restarts, within_s, depends_on)
        actor._bind(name)
        self._entries[name] = entry
        try:
            await self._nursery.start(self._supervise, entry)
        except ActorFailed as failure:
            # trio >= 0.25 re-raises a start() failure ``from None``; restore the cause
            raise failure from failure.error
        return actor.ref

    def lookup(self, name: str) -> ActorRef:
        """Return a ref to the actor registered as ``name`` (running or not).

        Raises:
            UnknownActor: if no actor has that name; the message lists the known names.
        """
        return self._entry(name).actor.ref

    def names(self) -> tuple[str, ...]:
        """Return the registered names, in spawn order."""
        return tuple(self._entries)

    def statistics(self) -> dict[str, ActorStatistics]:
        """Return a statistics snapshot per actor name, in spawn order."""
        return {name: e.actor.statistics() for name, e in self._entries.items()}

    def failures(self) -> tuple[ActorFailed, ...]:
        """Return every failure the supervisors handled by stopping or giving up, oldest first."""
        return tuple(self._failures)

    async def stop(self, name: str) -> None:
        """Close the actor's mailbox and wait until it has drained it and run ``on_stop``.

        From inside the actor's own handler, only closes the mailbox (waiting would deadlock).
        Stopping a stopped actor does nothing.

        Args:
            name: the actor to stop.

        Raises:
            UnknownActor: if no actor has that name.
            ValueError: if running actors depend on it; the message names them.
        """
        entry = self._entry(name)
        dependents = [
            n for n, e in self._entries.items() if name in e.depends_on and not e.done.is_set()
        ]
        if dependents:
            raise ValueError(f"cannot stop {name!r}: running actors depend on it: {dependents}")
        await self._stop_entry(entry)

    async def remove(self, name: str) -> None:
        """Stop the actor (as :meth:`stop`) and forget it: its name may be spawned again,
        and the system keeps nothing of it (a runtime that spawns actors per client-given
        name stays bounded).

        Raises:
            UnknownActor: if no actor has that name.
            ValueError: if running actors depend on it; the message names them.
        """
        await self.stop(name)
        del self._entries[name]

    async def aclose(self) -> None:
        """Stop every actor, dependents before their dependencies (reverse spawn order).

        Dependencies must be running when a dependent is spawned, so reverse spawn order
        always stops an actor before anything it depends on.
        """
        self._closing = True
        for entry in reversed(list(self._entries.values())):
            await self._stop_entry(entry)

    async def _stop_entry(self, entry: _Entry) -> None:
        entry.actor.close_mailbox()
        if entry.task is not trio.lowlevel.current_task():
            await entry.done.wait()

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownActor(name, self._entries) from None

    def _new_entry(
        self,
        actor: Actor,
        name: str,
        strategy: Strategy | str,
        max_restarts: int,
        within_s: float,
        depends_on: Sequence[str],
    ) -> _Entry:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"an actor named {name!r} already exists")
        if isinstance(depends_on, str):
            raise TypeError("depends_on must be a sequence of names, not a string")
        for dependency in depends_on:
            if self._entry(dependency).done.is_set():
                raise ValueError(f"dependency {dependency!r} of {name!r} is not running")
        return _Entry(
            actor=actor,
            strategy=Strategy.parse(strategy),
            budget=RestartBudget(max_restarts, within_s),
            depends_on=tuple(depends_on),
        )

    async def _supervise(self, entry: _Entry, *, task_status: TaskStatus) -> None:
        """Run one actor under its supervisor until it stops, fails for good or is cancelled.

        However it ends, its mailbox is closed: a cancelled actor's queued messages are
        discarded (pending asks answered ``ActorStopped``) and later sends, including
        ones blocked on a full mailbox, raise ``ActorStopped`` rather than wait for a
        reader that is gone (a shutdown's shielded cleanup would otherwise hang).
        """
        entry.task = trio.lowlevel.current_task()
        readiness = _Readiness(task_status)
        try:
            await self._run_supervised(entry, readiness)
        finally:
            if entry.actor._counters.state is ActorState.RUNNING:
                entry.actor._counters.state = ActorState.CANCELLED
            entry.actor._reject_pending()  # nothing is left after a normal stop
            entry.done.set()

    async def _run_supervised(self, entry: _Entry, readiness: _Readiness) -> None:
        """Run the actor, applying its strategy to every exception that escapes it."""
        actor = entry.actor
        error: Exception | None = None
        while True:
            try:
                if error is not None:
                    await actor.on_restart(error)
                await actor.run(task_status=readiness)
                return
            except Exception as exc:
                error = exc
                actor._counters.failures += 1
            if entry.strategy is Strategy.ESCALATE:
                self._give_up(entry, error, "strategy escalate", readiness)
                return
            if entry.strategy is Strategy.STOP:
                await self._stop_failed(entry, error, readiness)
                return
            if not entry.budget.try_consume(clock.now_s()):
                self._give_up(entry, error, f"over budget of {entry.budget.describe()}", readiness)
                return
            actor._counters.restarts += 1
            logger.warning(
                "actor %s failed; restart %d of %s",
                actor.name,
                entry.budget.in_window(clock.now_s()),
                entry.budget.describe(),
                exc_info=error,
            )

    async def _stop_failed(self, entry: _Entry, error: Exception, readiness: _Readiness) -> None:
        """Stop a failed actor: discard its mailbox, record the failure, run ``on_stop``."""
        actor = entry.actor
        logger.error("actor %s failed; stopping it", actor.name, exc_info=error)
        actor._counters.state = ActorState.FAILED
        actor._reject_pending()
        self._failures.append(ActorFailed(actor.name, error, "strategy stop"))
        try:
            await actor.on_stop()
        except Exception as stop_error:
            actor._counters.failures += 1
            self._give_up(entry, stop_error, "on_stop raised after a stop", readiness)
            return
        readiness.started()

    def _give_up(self, entry: _Entry, error: Exception, reason: str, readiness: _Readiness) -> None:
        """Fail the actor for good and raise ``ActorFailed``.

        Before the actor is ready the error is raised to the spawner; afterwards the system's
        nursery is cancelled and ``open_actor_system`` raises it on exit.
        """
        actor = entry.actor
        failure = ActorFailed(actor.name, error, reason)
        self._failures.append(failure)
        if readiness.is_started:
            self._fatal = self._fatal or failure
            # Cancel before closing the mailbox: blocked senders see Cancelled, not ActorStopped.
            self._nursery.cancel_scope.cancel()
        actor._counters.state = ActorState.FAILED
        actor._reject_pending()
        if not readiness.is_started:
            raise failure from error

    def _raise_if_failed(self) -> None:
        if self._fatal is not None:
            raise self._fatal


@asynccontextmanager
async def open_actor_system() -> AsyncIterator[ActorSystem]:
    """Open an actor system; on exit, stop its actors in order and wait for them.

    On a normal exit every actor drains its mailbox and runs ``on_stop``, dependents before
    their dependencies. When a supervisor gives up on an actor (``escalate``, or the restart
    budget is spent), the whole system is cancelled and ``ActorFailed`` is raised from the
    ``async with`` block; actors cancelled that way do not run ``on_stop``. An actor
    cancelled (that way, or by a scope around the block) refuses every later send with
    ``ActorStopped``; what it had queued is discarded.

    Yields:
        The actor system.

    Raises:
        ActorFailed: an actor failed and its supervisor gave up; ``__cause__`` is the error.
    """
    with ungrouped():  # the block's own error reaches the caller as itself (trio >= 0.25)
        async with trio.open_nursery() as nursery:
            system = ActorSystem(nursery)
            yield system
            await system.aclose()
    system._raise_if_failed()
