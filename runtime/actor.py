"""Actors and references to them.

An :class:`Actor` owns a bounded mailbox and processes one message at a time; other code talks
to it only through an :class:`ActorRef`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import trio

from . import clock
from .errors import ActorStopped, AskTimeout
from .mailbox import Envelope, Mailbox, Reply, open_item
from .stats import ActorCounters, ActorState, ActorStatistics

__all__ = ["DEFAULT_ASK_TIMEOUT_S", "DEFAULT_MAILBOX_CAPACITY", "Actor", "ActorRef", "TaskStatus"]

logger = logging.getLogger(__name__)

DEFAULT_MAILBOX_CAPACITY = 64
DEFAULT_ASK_TIMEOUT_S = 30.0


class TaskStatus(Protocol):
    """What ``nursery.start`` hands to the task it starts."""

    def started(self, value: Any = None) -> None:
        """Report that the task is ready."""


class Actor:
    """Base class of all actors.

    Subclasses implement :meth:`handle` (dispatching with ``match``) and may override
    :meth:`on_start`, :meth:`on_stop` and :meth:`on_restart`. Messages are handled one at a
    time, in arrival order.

    A ``tell`` whose handler raises lets the exception escape :meth:`run` to the supervisor.
    An ``ask`` whose handler raises sends the exception back to the asker, which re-raises it;
    the actor keeps running (counted in ``ask_errors``, not in ``failures``).

    Args:
        mailbox_capacity: how many messages may wait before ``tell`` blocks.

    Raises:
        ValueError: if ``mailbox_capacity`` is below 1.
    """

    def __init__(self, *, mailbox_capacity: int = DEFAULT_MAILBOX_CAPACITY) -> None:
        self._name = type(self).__name__
        self._bound = False
        self._running = False
        self._mailbox = Mailbox(mailbox_capacity)
        self._counters = ActorCounters()

    @property
    def name(self) -> str:
        """Return the actor's name: the spawn name, or the class name before spawning."""
        return self._name

    @property
    def ref(self) -> ActorRef:
        """Return a reference for sending messages to this actor."""
        return ActorRef(self)

    def statistics(self) -> ActorStatistics:
        """Return a snapshot of this actor's statistics."""
        c, box = self._counters, self._mailbox
        return ActorStatistics(
            name=self._name,
            state=c.state,
            processed=c.processed,
            mailbox_depth=box.depth,
            mailbox_high_water=box.high_water,
            mailbox_capacity=box.capacity,
            dropped=box.dropped,
            discarded=box.discarded,
            ask_errors=c.ask_errors,
            failures=c.failures,
            restarts=c.restarts,
            handler_time_s=c.handler_time_s,
        )

    async def handle(self, msg: Any) -> Any:
        """Handle one message; the return value is the reply when the message was asked.

        Args:
            msg: the message, usually a frozen msgspec Struct.

        Returns:
            The reply for ``ask``; ignored for ``tell``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement handle()")

    async def on_start(self) -> None:
        """Prepare the actor; called before the first message and after every restart."""

    async def on_stop(self) -> None:
        """Clean up once the mailbox is closed and drained (or after a failure with ``stop``)."""

    async def on_restart(self, error: Exception) -> None:
        """Reset state before a restart; the default keeps the state as it is.

        Called by a ``restart`` supervisor after ``error`` escaped the actor, before
        :meth:`on_start` runs again. The mailbox and its queued messages are kept; the message
        being handled when the error occurred is not redelivered.

        Args:
            error: the exception that escaped the actor.
        """

    def close_mailbox(self) -> None:
        """Refuse new messages; :meth:`run` drains the queued ones, calls ``on_stop``, returns.

        Sends after this raise ``ActorStopped``, including sends blocked on a full mailbox.
        Idempotent.
        """
        self._mailbox.close()

    async def run(self, *, task_status: TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Run the actor: ``on_start``, report ready, handle messages until closed, ``on_stop``.

        Start it with ``await nursery.start(actor.run)`` so that it is ready on return.

        Args:
            task_status: readiness hook supplied by ``nursery.start``.

        Raises:
            RuntimeError: if the actor is already running.
            Exception: whatever ``on_start``, ``on_stop`` or a told message's handler raises.
        """
        if self._running:
            raise RuntimeError(f"actor {self._name!r} is already running")
        self._running = True
        try:
            await self.on_start()
            self._counters.state = ActorState.RUNNING
            task_status.started()
            await self._loop()
            await self.on_stop()
            self._counters.state = ActorState.STOPPED
        finally:
            self._running = False

    async def _loop(self) -> None:
        """Handle every item until the mailbox is closed and drained.

        The hot path of ``tell``: per message, two clock readings and three counter
        updates, no allocation and no call beyond ``handle`` (asks go through
        :meth:`_answer`).
        """
        box, counters, handle = self._mailbox, self._counters, self.handle
        clock_s = time.perf_counter
        async for item in box:
            box.taken += 1
            started_s = clock_s()
            try:
                if type(item) is Envelope:
                    await self._answer(item)
                else:
                    await handle(item)
            finally:
                counters.processed += 1
                counters.handler_time_s += clock_s() - started_s

    async def _answer(self, envelope: Envelope) -> None:
        """Handle an ``ask`` (or a bare ``Envelope`` put without a reply channel, a tell)."""
        msg, reply_to = open_item(envelope)
        try:
            result = await self.handle(msg)
        except Exception as error:
            if reply_to is None:
                raise
            self._counters.ask_errors += 1
            logger.debug("actor %s replies with %r to an ask", self._name, error)
            _send_reply(envelope, Reply(error=error))
        else:
            if reply_to is not None:
                _send_reply(envelope, Reply(value=result))

    def _bind(self, name: str) -> None:
        """Give the actor its spawn name; an actor can be spawned once."""
        if self._bound:
            raise ValueError(f"actor {self._name!r} was already spawned")
        self._bound = True
        self._name = name

    def _reject_pending(self) -> None:
        """Discard queued messages, answering pending asks with ``ActorStopped``."""
        pending = self._mailbox.take_pending()
        if pending:
            logger.warning("actor %s discards %d queued messages", self._name, len(pending))
        for item in pending:
            _send_reply(item, Reply(error=ActorStopped(self._name)))


def _send_reply(item: Any, reply: Reply) -> None:
    """Send ``reply`` to the asker of mailbox ``item``, if any; a gone asker is logged."""
    if type(item) is not Envelope:
        return
    reply_to = item.reply_to
    if reply_to is None:
        return
    with reply_to:
        try:
            reply_to.send_nowait(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            logger.debug("reply dropped: the asker stopped waiting (timed out or cancelled)")


class ActorRef:
    """A handle for sending messages to an actor.

    Refs compare equal when they point at the same actor. Every send raises ``ActorStopped``
    once the actor's mailbox is closed.

    Args:
        actor: the actor this ref points at.
    """

    __slots__ = ("_actor",)

    def __init__(self, actor: Actor) -> None:
        self._actor = actor

    @property
    def name(self) -> str:
        """Return the actor's name."""
        return self._actor.name

    async def tell(self, msg: Any) -> None:
        """Send ``msg`` without waiting for it to be handled; wait while the mailbox is full.

        Args:
            msg: the message.

        Raises:
            ActorStopped: the actor's mailbox is closed.
        """
        try:
            await self._actor._mailbox.put(Envelope(msg) if type(msg) is Envelope else msg)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(self.name) from None

    def try_tell(self, msg: Any) -> bool:
        """Send ``msg`` if the mailbox has room, otherwise drop it (counted in ``dropped``).

        Args:
            msg: a droppable message (e.g. a hint or a progress signal).

        Returns:
            True if enqueued, False if dropped.

        Raises:
            ActorStopped: the actor's mailbox is closed.
        """
        try:
            return self._actor._mailbox.try_put(Envelope(msg) if type(msg) is Envelope else msg)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(self.name) from None

    async def ask(self, msg: Any, *, timeout_s: float = DEFAULT_ASK_TIMEOUT_S) -> Any:
        """Send ``msg`` and wait for the handler's return value.

        The timeout covers the whole round trip, including waiting for mailbox room.

        Args:
            msg: the message.
            timeout_s: seconds to wait for the reply (virtual under ``MockClock``).

        Returns:
            What the actor's ``handle`` returned for ``msg``.

        Raises:
            ValueError: if ``timeout_s`` is not positive.
            AskTimeout: no reply within ``timeout_s``.
            ActorStopped: the actor's mailbox is closed, or it stopped before replying.
            Exception: the exception the handler raised, re-raised here.
        """
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        reply_send, reply_receive = trio.open_memory_channel[Reply](1)
        with reply_receive, trio.move_on_at(clock.now_s() + timeout_s):
            await self._put(Envelope(msg, reply_send))
            try:
                reply: Reply = await reply_receive.receive()
            except trio.EndOfChannel:
                raise ActorStopped(self.name) from None
            return reply.unwrap()
        raise AskTimeout(self.name, timeout_s, type(msg).__name__)

    def statistics(self) -> ActorStatistics:
        """Return a snapshot of the actor's statistics."""
        return self._actor.statistics()

    async def _put(self, envelope: Envelope) -> None:
        try:
            await self._actor._mailbox.put(envelope)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(self.name) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorRef) and other._actor is self._actor

    def __hash__(self) -> int:
        return id(self._actor)

    def __repr__(self) -> str:
        return f"ActorRef({self.name!r})"
