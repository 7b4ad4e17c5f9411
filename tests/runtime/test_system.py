import pytest
import trio
import trio.testing

from pbkv.runtime import (
    Actor,
    ActorFailed,
    ActorState,
    ActorStopped,
    Strategy,
    UnknownActor,
    open_actor_system,
)
from pbkv.runtime.errors import exception_leaves


class Recorder(Actor):
    """Appends what happens to it to a shared log; ``"crash"`` raises, ``"get"`` replies."""

    def __init__(self, name: str, log: list[str], *, mailbox_capacity: int = 8) -> None:
        super().__init__(mailbox_capacity=mailbox_capacity)
        self.label = name
        self.log = log
        self.count = 0

    async def on_start(self) -> None:
        self.log.append(f"{self.label}:start")

    async def on_stop(self) -> None:
        self.log.append(f"{self.label}:stop")

    async def on_restart(self, error: Exception) -> None:
        self.log.append(f"{self.label}:restart:{error}")
        self.count = 0  # fresh state

    async def handle(self, msg):
        match msg:
            case "crash":
                raise ZeroDivisionError(f"crash after {self.count}")
            case "get":
                return self.count
            case ("sleep", seconds):
                await trio.sleep(seconds)
            case _:
                self.count += 1
                self.log.append(f"{self.label}:{msg}")


class FailingStart(Actor):
    async def on_start(self) -> None:
        raise OSError("no device")

    async def handle(self, msg):
        return msg


async def test_spawn_lookup_and_statistics():
    log: list[str] = []
    async with open_actor_system() as system:
        ref = await system.spawn(Recorder("a", log), name="a")
        assert log == ["a:start"]
        assert system.lookup("a") == ref
        assert ref.name == "a"
        await ref.tell("x")
        await ref.tell("y")
        assert await ref.ask("get") == 2
        assert system.names() == ("a",)
        stats = system.statistics()["a"]
    assert (stats.name, stats.state, stats.processed, stats.failures) == (
        "a",
        ActorState.RUNNING,
        3,
        0,
    )
    assert system.statistics()["a"].state is ActorState.STOPPED


async def test_lookup_of_unknown_name_lists_known_names():
    async with open_actor_system() as system:
        await system.spawn(Recorder("a", []), name="a")
        await system.spawn(Recorder("b", []), name="b")
        with pytest.raises(UnknownActor, match="unknown actor 'c'; known actors: 'a', 'b'"):
            system.lookup("c")


async def test_spawn_rejects_duplicate_names_and_respawns():
    async with open_actor_system() as system:
        actor = Recorder("a", [])
        await system.spawn(actor, name="a")
        with pytest.raises(ValueError, match="an actor named 'a' already exists"):
            await system.spawn(Recorder("a", []), name="a")
        with pytest.raises(ValueError, match="already spawned"):
            await system.spawn(actor, name="other")
        with pytest.raises(ValueError, match="unknown strategy 'retry'"):
            await system.spawn(Recorder("c", []), name="c", strategy="retry")
        with pytest.raises(UnknownActor, match="known actors: 'a'"):
            await system.spawn(Recorder("d", []), name="d", depends_on=["nope"])


async def test_shutdown_stops_dependents_before_dependencies_after_draining():
    log: list[str] = []
    async with open_actor_system() as system:
        store = await system.spawn(Recorder("store", log), name="store")
        await system.spawn(Recorder("cache", log), name="cache", depends_on=["store"])
        api = await system.spawn(Recorder("api", log), name="api", depends_on=["cache", "store"])
        await system.spawn(Recorder("metrics", log), name="metrics")
        await api.tell("q1")
        await api.tell("q2")
        await store.tell("w1")
        del log[:4]  # the starts
    assert [entry for entry in log if entry.endswith(":stop")] == [
        "metrics:stop",
        "api:stop",
        "cache:stop",
        "store:stop",
    ]
    # Each actor drained its mailbox before on_stop.
    assert [entry for entry in log if entry.startswith("api")] == ["api:q1", "api:q2", "api:stop"]
    assert [entry for entry in log if entry.startswith("store")] == ["store:w1", "store:stop"]
    with pytest.raises(ActorStopped, match="actor 'store' is stopped"):
        await store.tell("late")


async def test_stop_refuses_while_dependents_run_then_stops():
    log: list[str] = []
    async with open_actor_system() as system:
        await system.spawn(Recorder("db", log), name="db")
        await system.spawn(Recorder("app", log), name="app", depends_on=["db"])
        with pytest.raises(ValueError, match=r"cannot stop 'db': running actors .*\['app'\]"):
            await system.stop("db")
        await system.stop("app")
        await system.stop("db")
        await system.stop("db")  # already stopped: nothing happens
        assert log == ["db:start", "app:start", "app:stop", "db:stop"]
        with pytest.raises(ValueError, match="dependency 'db' of 'late' is not running"):
            await system.spawn(Recorder("late", log), name="late", depends_on=["db"])


async def test_an_actor_can_stop_itself():
    class Quitter(Actor):
        def __init__(self, system) -> None:
            super().__init__()
            self.system = system
            self.stopped = False

        async def handle(self, msg):
            await self.system.stop(self.name)

        async def on_stop(self) -> None:
            self.stopped = True

    async with open_actor_system() as system:
        actor = Quitter(system)
        ref = await system.spawn(actor, name="quitter")
        assert ref.try_tell("quit")
        assert ref.try_tell("queued before the stop, still handled")
        await trio.testing.wait_all_tasks_blocked()
        assert actor.stopped is True
        assert actor.statistics().processed == 2
        assert actor.statistics().state is ActorState.STOPPED
        with pytest.raises(ActorStopped):
            await ref.tell("refused")


async def test_restart_strategy_restarts_with_fresh_state_then_fails_past_budget(autojump_clock):
    log: list[str] = []
    with pytest.raises(ActorFailed) as info:
        async with open_actor_system() as system:
            ref = await system.spawn(
                Recorder("w", log), name="worker", strategy="restart", max_restarts=2, within_s=60.0
            )
            await ref.tell("m1")
            await ref.tell("crash")
            await ref.tell("m2")
            await ref.tell("crash")
            assert await ref.ask("get") == 0
            assert log == [
                "w:start",
                "w:m1",
                "w:restart:crash after 1",
                "w:start",
                "w:m2",
                "w:restart:crash after 1",
                "w:start",
            ]
            stats = ref.statistics()
            assert (stats.restarts, stats.failures, stats.state) == (2, 2, ActorState.RUNNING)
            await ref.tell("crash")
            await trio.sleep_forever()
    failure = info.value
    assert failure.actor_name == "worker"
    assert isinstance(failure.__cause__, ZeroDivisionError)
    assert failure.error is failure.__cause__
    assert str(failure) == (
        "actor 'worker' failed (over budget of 2 restarts within 60.0 s): "
        "ZeroDivisionError('crash after 0')"
    )
    assert system.failures() == (failure,)
    stats = system.statistics()["worker"]
    assert (stats.restarts, stats.failures, stats.state) == (2, 3, ActorState.FAILED)
    assert log[-1] == "w:start"  # cancelled, so no on_stop


async def test_restart_budget_window_is_virtual_time(autojump_clock):
    async with open_actor_system() as system:
        ref = await system.spawn(
            Recorder("w", []), name="w", strategy=Strategy.RESTART, max_restarts=1, within_s=10.0
        )
        for _ in range(3):
            await ref.tell("crash")
            await ref.ask("get")
            await trio.sleep(10.0)
        assert ref.statistics().restarts == 3
        assert trio.current_time() == 30.0


async def test_stop_strategy_stops_records_and_answers_pending_asks(autojump_clock):
    log: list[str] = []
    async with open_actor_system() as system:
        ref = await system.spawn(Recorder("s", log), name="s", strategy="stop")
        other = await system.spawn(Recorder("o", log), name="o")
        async with trio.open_nursery() as nursery:
            await ref.tell(("sleep", 1.0))
            await ref.tell("crash")
            await ref.tell("queued")

            async def ask_pending() -> None:
                with pytest.raises(ActorStopped):
                    await ref.ask("get")

            nursery.start_soon(ask_pending)
        with pytest.raises(ActorStopped):
            await ref.tell("after")
        await other.tell("still fine")
        (failure,) = system.failures()
        assert (failure.actor_name, failure.reason) == ("s", "strategy stop")
        assert isinstance(failure.__cause__, ZeroDivisionError)
        stats = ref.statistics()
        assert (stats.state, stats.failures, stats.discarded, stats.processed) == (
            ActorState.FAILED,
            1,
            2,
            2,
        )
    assert log == ["s:start", "o:start", "s:stop", "o:still fine", "o:stop"]


async def test_escalate_fails_the_system_at_once(autojump_clock):
    log: list[str] = []
    with pytest.raises(ActorFailed) as info:
        async with open_actor_system() as system:
            await system.spawn(Recorder("bystander", log), name="bystander")
            ref = await system.spawn(Recorder("e", log), name="e", strategy="escalate")
            await ref.tell("crash")
            await trio.sleep(1000.0)
    assert trio.current_time() == 0.0
    assert info.value.actor_name == "e"
    assert info.value.reason == "strategy escalate"
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    stats = system.statistics()
    assert (stats["e"].restarts, stats["e"].state) == (0, ActorState.FAILED)
    assert stats["bystander"].state is ActorState.CANCELLED
    assert log == ["bystander:start", "e:start"]


async def test_failure_before_ready_raises_at_spawn():
    async with open_actor_system() as system:
        with pytest.raises(ActorFailed) as info:
            await system.spawn(FailingStart(), name="dev", strategy="restart", max_restarts=1)
        assert info.value.actor_name == "dev"
        assert isinstance(info.value.__cause__, OSError)
        stats = system.statistics()["dev"]
        assert (stats.restarts, stats.failures, stats.state) == (1, 2, ActorState.FAILED)


async def test_stop_strategy_before_ready_returns_a_stopped_ref():
    async with open_actor_system() as system:
        ref = await system.spawn(FailingStart(), name="dev", strategy="stop")
        with pytest.raises(ActorStopped):
            await ref.tell("hello")
        assert [f.actor_name for f in system.failures()] == ["dev"]


async def test_spawn_after_shutdown_is_refused():
    async with open_actor_system() as system:
        pass
    with pytest.raises(RuntimeError, match="shutting down"):
        await system.spawn(Recorder("late", []), name="late")


async def test_a_cancelled_actor_refuses_sends_instead_of_leaving_them_blocked(autojump_clock):
    """Cancelling the system from outside stops its actors without draining; a sender
    (shielded, as a shutdown's cleanup is) is refused, not left blocked on a full mailbox."""
    with trio.CancelScope() as outer:
        async with open_actor_system() as system:
            ref = await system.spawn(Recorder("a", [], mailbox_capacity=2), name="a")
            await ref.tell(("sleep", 1.0))  # the actor is busy: the next two queue
            await trio.testing.wait_all_tasks_blocked()
            outer.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(5.0) as waited:
                with pytest.raises(ActorStopped):
                    for i in range(3):  # one more than the mailbox holds
                        await ref.tell(i)
                with pytest.raises(ActorStopped):
                    ref.try_tell("later")
    assert not waited.cancelled_caught
    assert trio.current_time() < 1.0  # nobody waited for the busy handler
    assert system.statistics()["a"].state is ActorState.CANCELLED


def test_the_blocks_own_error_leaves_the_system_as_itself_not_grouped():
    """Since trio 0.25 nurseries group what their body raised (strict_exception_groups);
    an app's ``KeyError`` inside ``open_actor_system`` must still reach it as a
    ``KeyError``, its context intact, while two errors at once stay a group."""
    log: list[str] = []

    async def raises(error: BaseException) -> None:
        async with open_actor_system() as system:
            await system.spawn(Recorder("a", log), name="a")
            raise error

    cause = ValueError("while handling this")
    error = KeyError("app bug")
    error.__context__ = cause
    with pytest.raises(KeyError, match="app bug") as caught:
        trio.run(raises, error)
    assert caught.value is error and error.__context__ is cause
    both = ExceptionGroup("two", [KeyError("a"), OSError("b")])
    with pytest.raises(ExceptionGroup) as grouped:
        trio.run(raises, both)
    assert [type(e) for e in exception_leaves(grouped.value)] == [KeyError, OSError]
