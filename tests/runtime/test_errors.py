import pytest

from pbkv.runtime import ActorError, ActorFailed, ActorStopped, AskTimeout, UnknownActor


def test_each_error_is_a_distinct_class():
    classes = [AskTimeout, ActorFailed, ActorStopped, UnknownActor]
    for cls in classes:
        assert issubclass(cls, ActorError)
        assert [issubclass(cls, other) for other in classes].count(True) == 1


def test_ask_timeout_names_actor_and_is_a_timeout_error():
    error = AskTimeout("kv", 2.0, "Lookup")
    assert isinstance(error, TimeoutError)
    assert (error.actor_name, error.timeout_s, error.message_type) == ("kv", 2.0, "Lookup")
    assert str(error) == "ask to actor 'kv' (Lookup) got no reply within 2.0 s"


def test_actor_failed_carries_name_error_and_cause():
    cause = ZeroDivisionError("boom")
    error = ActorFailed("engine", cause, "strategy escalate")
    assert error.actor_name == "engine"
    assert error.error is cause
    assert error.__cause__ is cause
    assert str(error) == "actor 'engine' failed (strategy escalate): ZeroDivisionError('boom')"


def test_unknown_actor_lists_known_names():
    error = UnknownActor("kvm", ["engine", "kv"])
    assert isinstance(error, LookupError)
    assert error.known == ("engine", "kv")
    assert str(error) == "unknown actor 'kvm'; known actors: 'engine', 'kv'"
    assert str(UnknownActor("x", [])) == "unknown actor 'x'; known actors: none"


def test_actor_stopped_names_actor():
    with pytest.raises(ActorStopped, match="actor 'kv' is stopped"):
        raise ActorStopped("kv")
