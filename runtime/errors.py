"""Exceptions raised by the actor runtime, one class per kind of failure."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = [
    "ActorError",
    "ActorFailed",
    "ActorStopped",
    "AskTimeout",
    "UnknownActor",
    "exception_leaves",
    "ungrouped",
]


def exception_leaves(group: BaseExceptionGroup) -> list[BaseException]:
    """Return the exceptions in ``group`` and its nested groups, depth first."""
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(exception_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves


@contextmanager
def ungrouped() -> Iterator[None]:
    """Raise an exception group that holds one exception as that exception.

    Since trio 0.25 a nursery wraps whatever its body raised in an exception group
    (``strict_exception_groups``), so a context manager that runs its caller's block
    inside a nursery would hand the caller a group for its own ``KeyError``. Around such
    a nursery this gives the caller its exception back (its ``__context__`` as it was);
    a group of several stays a group. Earlier trio raises the exception itself, which
    passes through unchanged.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = exception_leaves(group)
        if len(leaves) != 1:
            raise
        (leaf,) = leaves
        context = leaf.__context__
        try:
            raise leaf
        finally:
            leaf.__context__ = context  # not the group that carried it
            del leaf, group


class ActorError(Exception):
    """Base class of every error the actor runtime raises."""


class AskTimeout(ActorError, TimeoutError):
    """An ``ask`` got no reply within its timeout.

    Attributes:
        actor_name: the actor that was asked.
        timeout_s: the timeout that expired, in seconds.
        message_type: the class name of the message that was asked.
    """

    def __init__(self, actor_name: str, timeout_s: float, message_type: str) -> None:
        super().__init__(
            f"ask to actor {actor_name!r} ({message_type}) got no reply within {timeout_s} s"
        )
        self.actor_name = actor_name
        self.timeout_s = timeout_s
        self.message_type = message_type


class ActorStopped(ActorError):
    """A message was sent to an actor whose mailbox is closed.

    Attributes:
        actor_name: the stopped actor.
    """

    def __init__(self, actor_name: str) -> None:
        super().__init__(f"actor {actor_name!r} is stopped")
        self.actor_name = actor_name


class ActorFailed(ActorError):
    """An actor failed and its supervisor gave up on it.

    Raised when the strategy is ``escalate`` or the restart budget is spent; recorded (not
    raised) when the strategy is ``stop``. The original exception is both ``error`` and
    ``__cause__``.

    Attributes:
        actor_name: the actor that failed.
        error: the exception raised by the actor.
        reason: why the supervisor gave up (e.g. ``"restart budget spent: ..."``).
    """

    def __init__(self, actor_name: str, error: BaseException, reason: str) -> None:
        super().__init__(f"actor {actor_name!r} failed ({reason}): {error!r}")
        self.actor_name = actor_name
        self.error = error
        self.reason = reason
        self.__cause__ = error


class UnknownActor(ActorError, LookupError):
    """No actor is registered under a name.

    Attributes:
        name: the name looked up.
        known: the registered names, in spawn order.
    """

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = tuple(known)
        listing = ", ".join(repr(k) for k in self.known) or "none"
        super().__init__(f"unknown actor {name!r}; known actors: {listing}")
