"""EngineActor: owns an engine's scheduler loop for the lifetime of the actor system."""

from __future__ import annotations

import trio

from pbkv.engines.base import Engine
from pbkv.runtime import Actor, TaskStatus


class EngineActor(Actor):
    """Run ``engine.run`` beside the actor; stop it when the actor stops.

    Agents submit to the engine directly (its request queue is the real mailbox and
    admission happens inside its scheduler step, §4); this actor supervises the loop,
    so an engine crash propagates through the actor system naming ``engine``.
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(mailbox_capacity=1)
        self.engine = engine

    async def run(self, *, task_status: TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.engine.run)
            await super().run(task_status=task_status)
            nursery.cancel_scope.cancel()

    async def handle(self, msg: object) -> None:
        raise TypeError(f"EngineActor takes no messages, got {type(msg).__name__}")
