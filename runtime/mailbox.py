"""An actor's bounded mailbox: a trio memory channel plus its depth and drop counters.

A mailbox carries *items*: a told message travels bare (nothing is allocated beyond what
the channel needs), an asked one inside an :class:`Envelope` that names where the reply
goes. The actor's loop tells them apart with :func:`open_item`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import trio

__all__ = ["Envelope", "Mailbox", "Reply", "open_item"]


@dataclass(frozen=True, slots=True)
class Reply:
    """The outcome of one ``ask``: a value, or the exception the handler raised."""

    value: Any = None
    error: Exception | None = None

    def unwrap(self) -> Any:
        """Return the value, or raise the handler's exception.

        Returns:
            The handler's return value.

        Raises:
            Exception: the exception the handler raised, re-raised as is.
        """
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message in a mailbox; ``reply_to`` is set when the sender asked for a reply.

    ``ask`` wraps its message in one; ``tell`` sends the message bare, unless the message
    is itself an ``Envelope`` (then it is wrapped, so it arrives as it was sent).
    """

    msg: Any
    reply_to: trio.MemorySendChannel[Reply] | None = None


def open_item(item: Any) -> tuple[Any, trio.MemorySendChannel[Reply] | None]:
    """Return ``(message, reply_to)`` of a mailbox item (``reply_to`` is ``None`` for a tell)."""
    if type(item) is Envelope:
        return item.msg, item.reply_to
    return item, None


class Mailbox:
    """A bounded FIFO of items (bare told messages and ask envelopes) for one actor.

    All senders share one send channel so that closing the mailbox closes it for everyone:
    after :meth:`close`, sends raise ``trio.ClosedResourceError`` (tasks blocked in a send
    included), and the receiving side still drains what was queued, then ends.

    The high-water mark counts items accepted and not yet taken by the receiver (one
    handed straight to a waiting receiver counts until that receiver runs), at most
    ``capacity``; it is kept with two integers so that a send never builds a statistics
    record. :attr:`depth` is the channel's own buffer count.

    Args:
        capacity: how many items may wait; must be at least 1.

    Raises:
        ValueError: if ``capacity`` is below 1.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"mailbox_capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.high_water = 0
        self.dropped = 0
        self.discarded = 0
        self.accepted = 0
        """Items accepted by :meth:`put` / :meth:`try_put`."""
        self.taken = 0
        """Items the receiver took (its loop counts them; see :meth:`__aiter__`)."""
        self._closed = False
        self._send, self._receive = trio.open_memory_channel[Envelope](capacity)

    @property
    def depth(self) -> int:
        """Return how many items wait in the channel buffer now."""
        return int(self._receive.statistics().current_buffer_used)

    @property
    def closed(self) -> bool:
        """Return whether the mailbox refuses new items."""
        return self._closed

    async def put(self, item: Any) -> None:
        """Enqueue ``item``, waiting while the mailbox is full.

        Raises:
            trio.ClosedResourceError: the mailbox was closed.
            trio.BrokenResourceError: the receiving side is gone.
        """
        await self._send.send(item)
        self.accepted += 1
        if self.accepted - self.taken > self.high_water:
            self._raise_high_water()

    def try_put(self, item: Any) -> bool:
        """Enqueue ``item`` if there is room; otherwise count it as dropped.

        Returns:
            True if enqueued, False if dropped.

        Raises:
            trio.ClosedResourceError: the mailbox was closed.
            trio.BrokenResourceError: the receiving side is gone.
        """
        try:
            self._send.send_nowait(item)
        except trio.WouldBlock:
            self.dropped += 1
            return False
        self.accepted += 1
        if self.accepted - self.taken > self.high_water:
            self._raise_high_water()
        return True

    def close(self) -> None:
        """Refuse new items; queued ones can still be received. Idempotent."""
        self._closed = True
        self._send.close()

    def __aiter__(self) -> AsyncIterator[Any]:
        """Iterate over items in order until the mailbox is closed and empty.

        The receiver adds one to :attr:`taken` per item it takes (the actor's loop does;
        iterating here does not, so that the loop pays no extra call per message).
        """
        iterator: AsyncIterator[Any] = self._receive
        return iterator

    def take_pending(self) -> list[Any]:
        """Close the mailbox for good and return what was still queued. Idempotent.

        Returns:
            The queued items, oldest first (none the second time); they are counted as
            discarded.
        """
        self.close()
        pending: list[Any] = []
        while True:
            try:
                pending.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        self._receive.close()
        self.discarded += len(pending)
        self.taken += len(pending)
        return pending

    def _raise_high_water(self) -> None:
        self.high_water = min(self.capacity, self.accepted - self.taken)
