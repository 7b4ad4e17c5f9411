"""An actor's bounded mailbox: a trio memory channel plus its depth and drop counters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import trio

__all__ = ["Envelope", "Mailbox", "Reply"]


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
    """A message in a mailbox; ``reply_to`` is set when the sender asked for a reply."""

    msg: Any
    reply_to: trio.MemorySendChannel[Reply] | None = None


class Mailbox:
    """A bounded FIFO of envelopes for one actor.

    All senders share one send channel so that closing the mailbox closes it for everyone:
    after :meth:`close`, sends raise ``trio.ClosedResourceError`` (tasks blocked in a send
    included), and the receiving side still drains what was queued, then ends.

    Args:
        capacity: how many envelopes may wait; must be at least 1.

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
        self._closed = False
        self._send, self._receive = trio.open_memory_channel[Envelope](capacity)

    @property
    def depth(self) -> int:
        """Return how many envelopes are waiting."""
        return int(self._receive.statistics().current_buffer_used)

    @property
    def closed(self) -> bool:
        """Return whether the mailbox refuses new envelopes."""
        return self._closed

    async def put(self, envelope: Envelope) -> None:
        """Enqueue ``envelope``, waiting while the mailbox is full.

        Raises:
            trio.ClosedResourceError: the mailbox was closed.
            trio.BrokenResourceError: the receiving side is gone.
        """
        await self._send.send(envelope)
        self._note_depth()

    def try_put(self, envelope: Envelope) -> bool:
        """Enqueue ``envelope`` if there is room; otherwise count it as dropped.

        Returns:
            True if enqueued, False if dropped.

        Raises:
            trio.ClosedResourceError: the mailbox was closed.
            trio.BrokenResourceError: the receiving side is gone.
        """
        try:
            self._send.send_nowait(envelope)
        except trio.WouldBlock:
            self.dropped += 1
            return False
        self._note_depth()
        return True

    def close(self) -> None:
        """Refuse new envelopes; queued ones can still be received. Idempotent."""
        self._closed = True
        self._send.close()

    def __aiter__(self) -> AsyncIterator[Envelope]:
        """Iterate over envelopes in order until the mailbox is closed and empty."""
        iterator: AsyncIterator[Envelope] = self._receive
        return iterator

    def take_pending(self) -> list[Envelope]:
        """Close the mailbox for good and return what was still queued.

        Returns:
            The queued envelopes, oldest first; they are counted as discarded.
        """
        self.close()
        pending: list[Envelope] = []
        while True:
            try:
                pending.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        self._receive.close()
        self.discarded += len(pending)
        return pending

    def _note_depth(self) -> None:
        self.high_water = max(self.high_water, self.depth)
