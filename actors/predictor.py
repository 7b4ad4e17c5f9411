"""PredictorActor: batches concurrent forecast requests and falls back on failure (§6)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import trio

from pbkv.actors.events import ForecastRequest
from pbkv.predictor.base import Forecaster, WorkflowState
from pbkv.runtime import Actor

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PredictorStatistics:
    requests: int
    batches: int
    max_batch: int
    fallbacks: int
    failures: int


class PredictorActor(Actor):
    """Serve K-step forecasts from a chain of forecasters.

    Requests arriving within ``max_wait_s`` of each other (up to ``max_batch``) go to the
    model as one batch. If a forecaster raises, the next one in ``chain`` is tried
    (e.g. graphsage → markov); if all fail, the reply is ``None`` (the KV manager then
    keeps its last scores: LAE behaviour). Nothing stalls.

    Args:
        chain: forecasters in order of preference; all share one agent vocabulary.
        max_batch: most requests per model call.
        max_wait_s: how long the first request of a batch waits for company.
    """

    def __init__(
        self,
        chain: Sequence[Forecaster],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.0,
        mailbox_capacity: int = 1024,
    ) -> None:
        super().__init__(mailbox_capacity=mailbox_capacity)
        if not chain:
            raise ValueError("chain must hold at least one forecaster")
        self.chain = list(chain)
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._pending: list[ForecastRequest] = []
        self._flush_at: float | None = None
        self._requests = self._batches = self._max_batch = self._fallbacks = self._failures = 0

    @property
    def agents(self) -> tuple[str, ...]:
        return self.chain[0].agents

    async def handle(self, msg: ForecastRequest) -> None:
        match msg:
            case ForecastRequest():
                self._requests += 1
                self._pending.append(msg)
                if len(self._pending) >= self.max_batch or self._mailbox_empty():
                    if self.max_wait_s > 0 and len(self._pending) < self.max_batch:
                        await trio.sleep(self.max_wait_s)
                        if not self._mailbox_empty():
                            return
                    self._flush()
            case _:
                raise TypeError(f"PredictorActor cannot handle {type(msg).__name__}")

    def _mailbox_empty(self) -> bool:
        return self._mailbox.depth == 0

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self._batches += 1
        self._max_batch = max(self._max_batch, len(batch))
        forecasts = self._forecast(batch)
        for req, forecast in zip(batch, forecasts, strict=True):
            try:
                req.reply.send_nowait(forecast)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                log.debug("forecast for %s no longer wanted", req.workflow_id)

    def _forecast(self, batch: list[ForecastRequest]) -> list[np.ndarray | None]:
        states = [WorkflowState(r.workflow_id, r.app, r.path, r.task_text, r.hidden) for r in batch]
        for i, forecaster in enumerate(self.chain):
            try:
                return list(forecaster.forecast(states))
            except Exception:
                self._failures += 1
                log.exception("forecaster %s failed on a batch of %d", forecaster.name, len(batch))
                if i + 1 < len(self.chain):
                    self._fallbacks += 1
        return [None] * len(batch)

    def predictor_statistics(self) -> PredictorStatistics:
        return PredictorStatistics(
            self._requests, self._batches, self._max_batch, self._fallbacks, self._failures
        )
