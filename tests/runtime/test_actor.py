import time

import msgspec
import pytest
import trio
import trio.testing

from pbkv.runtime import (
    Actor,
    ActorRef,
    ActorState,
    ActorStatistics,
    ActorStopped,
    AskTimeout,
)


class Add(msgspec.Struct, tag=True, frozen=True):
    amount: int


class Total(msgspec.Struct, tag=True, frozen=True):
    pass


class Divide(msgspec.Struct, tag=True, frozen=True):
    by: int


class Sleep(msgspec.Struct, tag=True, frozen=True):
    seconds: float


class Counter(Actor):
    def __init__(self, *, mailbox_capacity: int = 8) -> None:
        super().__init__(mailbox_capacity=mailbox_capacity)
        self.total = 0
        self.events: list[str] = []

    async def on_start(self) -> None:
        self.events.append("start")

    async def on_stop(self) -> None:
        self.events.append("stop")

    async def handle(self, msg):
        match msg:
            case Add(amount=amount):
                self.total += amount
            case Total():
                return self.total
            case Divide(by=by):
                return self.total // by
            case Sleep(seconds=seconds):
                await trio.sleep(seconds)
            case _:
                raise TypeError(f"unexpected message {msg!r}")


class Gated(Actor):
    """Handles each message only when the test hands it a token."""

    def __init__(self, capacity: int) -> None:
        super().__init__(mailbox_capacity=capacity)
        self.tokens_send, self.tokens = trio.open_memory_channel[None](100)
        self.handled: list[int] = []

    async def handle(self, msg):
        await self.tokens.receive()
        self.handled.append(msg)


async def test_run_reports_ready_then_stops_after_draining():
    actor = Counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        assert actor.events == ["start"]
        assert actor.statistics().state is ActorState.RUNNING
        ref = actor.ref
        await ref.tell(Add(2))
        await ref.tell(Add(3))
        actor.close_mailbox()
    assert actor.total == 5
    assert actor.events == ["start", "stop"]
    assert actor.statistics().state is ActorState.STOPPED


async def test_ask_round_trip_returns_the_reply():
    actor = Counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        await actor.ref.tell(Add(40))
        await actor.ref.tell(Add(2))
        assert await actor.ref.ask(Total()) == 42
        assert await actor.ref.ask(Divide(by=2)) == 21
        actor.close_mailbox()


async def test_ask_error_is_raised_at_asker_and_actor_keeps_running():
    actor = Counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        with pytest.raises(ZeroDivisionError):
            await actor.ref.ask(Divide(by=0))
        await actor.ref.tell(Add(7))
        assert await actor.ref.ask(Total()) == 7
        actor.close_mailbox()
    stats = actor.statistics()
    assert (stats.processed, stats.ask_errors, stats.failures) == (3, 1, 0)


async def test_tell_error_escapes_run():
    actor = Counter()
    # bare under trio's old loose exception groups, grouped under strict ones (>= 0.25)
    with pytest.RaisesGroup(
        pytest.RaisesExc(TypeError, match="unexpected message 'junk'"),
        allow_unwrapped=True,
        flatten_subgroups=True,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            await actor.ref.tell("junk")
            await trio.sleep_forever()


async def test_ask_times_out_in_virtual_time(autojump_clock):
    actor = Counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        start_s = trio.current_time()
        with pytest.raises(AskTimeout) as info:
            await actor.ref.ask(Sleep(seconds=100.0), timeout_s=1.5)
        assert trio.current_time() - start_s == 1.5
        assert (info.value.actor_name, info.value.message_type) == ("Counter", "Sleep")
        assert await actor.ref.ask(Total(), timeout_s=200.0) == 0  # the late reply is dropped
        assert trio.current_time() - start_s == 100.0
        actor.close_mailbox()


async def test_ask_rejects_non_positive_timeout():
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        await Counter().ref.ask(Total(), timeout_s=0)


async def test_tell_blocks_when_mailbox_is_full_and_unblocks_after_a_receive():
    actor = Gated(capacity=2)
    sent: list[int] = []

    async def produce() -> None:
        for i in range(1, 5):
            await actor.ref.tell(i)
            sent.append(i)

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        nursery.start_soon(produce)
        await trio.testing.wait_all_tasks_blocked()
        # 1 is in the handler, 2 and 3 fill the mailbox, the producer waits with 4.
        assert sent == [1, 2, 3]
        assert actor.statistics().mailbox_depth == 2
        actor.tokens_send.send_nowait(None)  # finish 1; the actor receives 2
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [1, 2, 3, 4]
        assert actor.handled == [1]
        for _ in range(3):
            actor.tokens_send.send_nowait(None)
        actor.close_mailbox()
    assert actor.handled == [1, 2, 3, 4]
    stats = actor.statistics()
    assert (stats.mailbox_high_water, stats.mailbox_depth, stats.processed) == (2, 0, 4)


async def test_try_tell_drops_when_full_and_counts():
    actor = Counter(mailbox_capacity=2)
    ref = actor.ref
    assert [ref.try_tell(Add(1)) for _ in range(4)] == [True, True, False, False]
    stats = ref.statistics()
    assert (stats.dropped, stats.mailbox_depth, stats.mailbox_high_water) == (2, 2, 2)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        assert await ref.ask(Total()) == 2
        actor.close_mailbox()


async def test_sending_to_a_stopped_actor_raises_actor_stopped():
    actor = Counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        actor.close_mailbox()
    ref = actor.ref
    with pytest.raises(ActorStopped, match="actor 'Counter' is stopped"):
        await ref.tell(Add(1))
    with pytest.raises(ActorStopped):
        ref.try_tell(Add(1))
    with pytest.raises(ActorStopped):
        await ref.ask(Total())


async def test_a_sender_blocked_on_a_full_mailbox_gets_actor_stopped_on_close():
    actor = Counter(mailbox_capacity=1)
    await actor.ref.tell(Add(1))
    async with trio.open_nursery() as nursery:

        async def blocked_send() -> None:
            with pytest.raises(ActorStopped):
                await actor.ref.tell(Add(2))

        nursery.start_soon(blocked_send)
        await trio.testing.wait_all_tasks_blocked()
        actor.close_mailbox()
    assert actor.statistics().mailbox_depth == 1


async def test_run_twice_at_once_is_refused():
    actor = Counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        with pytest.raises(RuntimeError, match="already running"):
            await actor.run()
        actor.close_mailbox()


async def test_statistics_count_processed_messages_and_wall_clock_handler_time():
    class Busy(Actor):
        async def handle(self, msg):
            time.sleep(0.002)  # wall-clock work, invisible to the trio clock

    actor = Busy(mailbox_capacity=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        for i in range(3):
            await actor.ref.tell(i)
        actor.close_mailbox()
    stats = actor.statistics()
    assert isinstance(stats, ActorStatistics)
    assert (stats.name, stats.processed, stats.restarts, stats.dropped) == ("Busy", 3, 0, 0)
    assert stats.mailbox_capacity == 4
    assert stats.handler_time_s >= 0.006


def test_refs_compare_by_actor():
    actor = Counter()
    assert actor.ref == actor.ref
    assert hash(actor.ref) == hash(actor.ref)
    assert actor.ref != Counter().ref
    assert repr(actor.ref) == "ActorRef('Counter')"
    assert isinstance(actor.ref, ActorRef)


def test_mailbox_capacity_is_validated():
    with pytest.raises(ValueError, match="mailbox_capacity"):
        Counter(mailbox_capacity=0)
