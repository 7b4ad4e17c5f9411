import pytest
import trio

from pbkv.runtime.mailbox import Envelope, Mailbox, Reply


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="mailbox_capacity must be at least 1, got 0"):
        Mailbox(0)


async def test_try_put_drops_when_full_and_tracks_depth():
    box = Mailbox(2)
    assert [box.try_put(Envelope(i)) for i in range(3)] == [True, True, False]
    assert (box.depth, box.high_water, box.dropped) == (2, 2, 1)


async def test_closed_mailbox_drains_then_ends():
    box = Mailbox(4)
    await box.put(Envelope("a"))
    await box.put(Envelope("b"))
    box.close()
    assert box.closed
    with pytest.raises(trio.ClosedResourceError):
        await box.put(Envelope("c"))
    assert [envelope.msg async for envelope in box] == ["a", "b"]


async def test_take_pending_discards_and_counts():
    box = Mailbox(4)
    box.try_put(Envelope("a"))
    box.try_put(Envelope("b"))
    assert [envelope.msg for envelope in box.take_pending()] == ["a", "b"]
    assert (box.discarded, box.depth, box.closed) == (2, 0, True)
    assert box.take_pending() == []  # again: nothing left, nothing raised
    assert box.discarded == 2


def test_reply_unwraps_value_or_raises_error():
    assert Reply(value=3).unwrap() == 3
    error = KeyError("k")
    with pytest.raises(KeyError) as info:
        Reply(error=error).unwrap()
    assert info.value is error
