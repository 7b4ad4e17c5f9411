"""pbkv.runtime: a small trio actor runtime (DESIGN §3).

Actors own bounded mailboxes and handle one message at a time; an :class:`ActorSystem`
(opened with :func:`open_actor_system`) names, supervises and stops them in order. Time comes
from :func:`now_s`, so ``trio.testing.MockClock`` runs everything in virtual time.
"""

from .actor import DEFAULT_ASK_TIMEOUT_S, DEFAULT_MAILBOX_CAPACITY, Actor, ActorRef, TaskStatus
from .clock import now_s, seed_scheduler
from .codec import EventRecorder, EventSink, EventTee, iter_events, read_events
from .errors import ActorError, ActorFailed, ActorStopped, AskTimeout, UnknownActor
from .stats import ActorState, ActorStatistics
from .supervision import RestartBudget, Strategy
from .system import ActorSystem, open_actor_system

__all__ = [
    "DEFAULT_ASK_TIMEOUT_S",
    "DEFAULT_MAILBOX_CAPACITY",
    "Actor",
    "ActorError",
    "ActorFailed",
    "ActorRef",
    "ActorState",
    "ActorStatistics",
    "ActorStopped",
    "ActorSystem",
    "AskTimeout",
    "EventRecorder",
    "EventSink",
    "EventTee",
    "RestartBudget",
    "Strategy",
    "TaskStatus",
    "UnknownActor",
    "iter_events",
    "now_s",
    "open_actor_system",
    "read_events",
    "seed_scheduler",
]
