"""PredictorActor: batches concurrent forecast requests and falls back on failure (§6)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import trio

from pbkv.actors.events import ForecastRequest, PathObserved
from pbkv.kvmanager import validate_forecast
from pbkv.predictor.base import Forecast, Forecaster, WorkflowState
from pbkv.predictor.online import OnlineAccuracy
from pbkv.runtime import Actor, now_s

log = logging.getLogger(__name__)

MAX_LOGGED_UNKNOWN_AGENTS = 256
"""Distinct unknown agent names logged (and listed in the statistics) at most; a server's
clients name agents freely, so the set is bounded."""


def learns_agents(forecaster: Forecaster) -> bool:
    """Whether ``forecaster`` has a per-app, growing vocabulary (an online forecaster:
    ``forecast_each`` and ``observe``) rather than fixed ``agents`` columns."""
    return hasattr(forecaster, "forecast_each") and hasattr(forecaster, "observe")


@dataclass(frozen=True, slots=True)
class PredictorStatistics:
    """Counters of a :class:`PredictorActor`.

    Args:
        requests: forecast requests received.
        batches: model calls made (one per batch, whatever the fallbacks).
        max_batch: the largest batch so far.
        fallbacks: batches handed to the next forecaster after one failed.
        failures: forecaster calls that raised.
        unanswered: requests answered ``None`` because every forecaster failed.
        unknown_agent_requests: requests answered ``None`` because their path names an
            agent outside the forecasters' vocabulary (that workflow alone goes without).
        unknown_agents: the distinct such agents, sorted.
        rejected: single forecasts refused as malformed (not finite, negative, rows not
            summing to 1, wrong shape); each went on to the next forecaster.
    """

    requests: int
    batches: int
    max_batch: int
    fallbacks: int
    failures: int
    unanswered: int = 0
    unknown_agent_requests: int = 0
    unknown_agents: tuple[str, ...] = ()
    rejected: int = 0


class PredictorActor(Actor):
    """Serve K-step forecasts from a chain of forecasters.

    Requests are collected into one batch until ``max_batch`` are pending, or the
    mailbox is empty and the oldest pending request has waited ``max_wait_s``; the batch
    then goes to the model in one call. If a forecaster raises on a batch, it is tried
    on each state alone, so one bad state costs only its own forecast; the states it
    still fails go to the next one in ``chain`` (e.g. graphsage → markov); a state every
    forecaster fails is answered ``None`` (the KV manager then keeps that workflow's last
    scores: LAE behaviour). Every forecast is validated: a malformed one (not finite,
    negative, rows not summing to 1) fails that state alone. A state whose path names an
    agent outside the vocabulary (a live app's agent the predictor was not trained on) is
    answered ``None`` without a model call, logged once per agent and counted. Nothing
    stalls.

    With ``run_in_thread`` the forecaster runs in a trio worker thread, so a slow model
    never blocks the event loop (requests keep queueing and form the next batch). Under
    ``trio.testing.MockClock`` with autojump a thread lets virtual time jump by however
    long the model takes in wall time, so simulations keep the default (inline).

    Args:
        chain: forecasters in order of preference; the fixed-vocabulary ones share one
            agent vocabulary, an online one (:func:`learns_agents`) keeps one per app and
            learns from the ended workflows' paths (:class:`PathObserved`).
        max_batch: most requests per model call, >= 1.
        max_wait_s: longest time the oldest pending request waits for company, >= 0.
        run_in_thread: run the forecaster in a worker thread (real-time serving).
        mailbox_capacity: requests that may queue before senders block.

    Raises:
        ValueError: an empty chain, forecasters over different agents, or a bad bound.
    """

    def __init__(
        self,
        chain: Sequence[Forecaster],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.0,
        run_in_thread: bool = False,
        mailbox_capacity: int = 1024,
    ) -> None:
        super().__init__(mailbox_capacity=mailbox_capacity)
        if not chain:
            raise ValueError("chain must hold at least one forecaster")
        fixed = [f for f in chain if not learns_agents(f)]
        if any(tuple(f.agents) != tuple(fixed[0].agents) for f in fixed):
            raise ValueError(
                "every fixed-vocabulary forecaster of chain must share one agent vocabulary"
            )
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.chain = list(chain)
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.run_in_thread = run_in_thread
        self._pending: list[ForecastRequest] = []
        self._deadline_s = 0.0
        self._requests = self._batches = self._max_batch = 0
        self._fallbacks = self._failures = self._unanswered = 0
        self._fixed_agents: tuple[str, ...] = tuple(fixed[0].agents) if fixed else ()
        self._vocabulary = frozenset(self._fixed_agents)
        self._learners = [f for f in self.chain if learns_agents(f)]
        self._learns = bool(self._learners)
        self._unknown_requests = self._rejected = 0
        self._unknown_agents: set[str] = set()

    @property
    def agents(self) -> tuple[str, ...]:
        """The fixed forecasters' vocabulary (empty when only online ones serve)."""
        return self._fixed_agents

    async def handle(self, msg: ForecastRequest) -> None:
        match msg:
            case ForecastRequest():
                self._requests += 1
                if msg.path:
                    for forecaster in self._learners:
                        forecaster.observe_step(  # type: ignore[attr-defined]
                            msg.workflow_id, msg.app, msg.path, tenant=msg.tenant
                        )
                if not self._pending:
                    self._deadline_s = now_s() + self.max_wait_s
                self._pending.append(msg)
                if len(self._pending) >= self.max_batch:
                    await self._flush()
                elif self._mailbox_empty():
                    await self._flush_when_due()
            case PathObserved(app=app, path=path, tenant=tenant, workflow_id=w):
                for forecaster in self._learners:
                    forecaster.observe(app, path, tenant=tenant, workflow_id=w)  # type: ignore[attr-defined]
            case _:
                raise TypeError(f"PredictorActor cannot handle {type(msg).__name__}")

    async def on_stop(self) -> None:
        """Answer what is still pending when the mailbox closes."""
        if self._pending:
            await self._flush()

    async def _flush_when_due(self) -> None:
        """Wait for company until the deadline; flush unless more requests queued."""
        wait_s = self._deadline_s - now_s()
        if wait_s > 0:
            await trio.sleep(wait_s)
            if not self._mailbox_empty():
                return  # they join this batch; the last of them flushes it
        await self._flush()

    def _mailbox_empty(self) -> bool:
        return self._mailbox.depth == 0

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self._batches += 1
        self._max_batch = max(self._max_batch, len(batch))
        if self.run_in_thread:
            forecasts = await trio.to_thread.run_sync(self._forecast, batch)
        else:
            forecasts = self._forecast(batch)
        for req, forecast in zip(batch, forecasts, strict=True):
            try:
                req.reply.send_nowait(forecast)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                log.debug("forecast for %s no longer wanted", req.workflow_id)

    def _forecast(self, batch: list[ForecastRequest]) -> list[Forecast | None]:
        """Run the chain on ``batch``; may run in a worker thread (touches only counters)."""
        out: list[Forecast | None] = [None] * len(batch)
        known = [self._known_path(r) for r in batch]
        rows = [i for i, r in enumerate(batch) if r.path and (known[i] or self._learns)]
        states = {
            i: WorkflowState(
                r.workflow_id, r.app, r.path, r.task_text, r.hidden, r.context_tail, r.tenant
            )
            for i, r in ((i, batch[i]) for i in rows)
        }
        for position, forecaster in enumerate(self.chain):
            eligible = rows if learns_agents(forecaster) else [i for i in rows if known[i]]
            if not eligible:
                continue
            batch_states = [states[i] for i in eligible]
            answered = self._validated(
                forecaster, batch_states, self._run(forecaster, batch_states)
            )
            for i, forecast in zip(eligible, answered, strict=True):
                out[i] = forecast
            if position + 1 < len(self.chain) and any(out[i] is None for i in eligible):
                self._fallbacks += 1
            rows = [i for i in rows if out[i] is None]
        self._unanswered += len(rows)
        return out

    def _validated(
        self,
        forecaster: Forecaster,
        states: list[WorkflowState],
        forecasts: list[Forecast | None],
    ) -> list[Forecast | None]:
        """Replace each malformed forecast by ``None`` (counted and logged, §10)."""
        out: list[Forecast | None] = []
        for state, forecast in zip(states, forecasts, strict=True):
            if forecast is not None:
                try:
                    probabilities = validate_forecast(forecast.probabilities, len(forecast.agents))
                    forecast = Forecast(probabilities, forecast.agents)
                except ValueError as exc:
                    self._rejected += 1
                    log.warning(
                        "forecaster %s: rejected forecast for %s: %s",
                        forecaster.name,
                        state.workflow_id,
                        exc,
                    )
                    forecast = None
            out.append(forecast)
        return out

    def _known_path(self, request: ForecastRequest) -> bool:
        """Whether every agent of ``request.path`` is in the fixed vocabulary; log new
        strangers (the first :data:`MAX_LOGGED_UNKNOWN_AGENTS` distinct names)."""
        unknown = [a for a in request.path if a not in self._vocabulary]
        if request.path and not unknown:
            return True
        if self._learns:
            return False  # an online forecaster learns it: nothing to report
        self._unknown_requests += 1
        for agent in unknown:
            if agent in self._unknown_agents:
                continue
            if len(self._unknown_agents) >= MAX_LOGGED_UNKNOWN_AGENTS:
                break
            self._unknown_agents.add(agent)
            log.warning(
                "agent %r (app %s) is unknown to the predictor (agents: %s); its "
                "workflows go without forecasts",
                agent,
                request.app,
                ", ".join(self.agents),
            )
        return False

    def _run(self, forecaster: Forecaster, states: list[WorkflowState]) -> list[Forecast | None]:
        """Forecast ``states`` in one call; ``None`` for each state it failed.

        A ``ValueError`` is the interface's bad-input error (one state's path or hidden
        size), so the batch is retried state by state and only the refused states fail;
        any other error fails the whole batch.
        """
        try:
            return self._call(forecaster, states)
        except ValueError as exc:
            if len(states) == 1:
                self._failures += 1
                log.warning(
                    "forecaster %s refused workflow %s: %s",
                    forecaster.name,
                    states[0].workflow_id,
                    exc,
                )
                return [None]
        except Exception:
            self._failures += 1
            log.exception("forecaster %s failed on a batch of %d", forecaster.name, len(states))
            return [None] * len(states)
        out: list[Forecast | None] = []
        refused: list[str] = []
        for state in states:
            try:
                out.append(self._call(forecaster, [state])[0])
            except Exception as exc:
                refused.append(f"{state.workflow_id} ({exc})")
                out.append(None)
        self._failures += 1
        log.warning(
            "forecaster %s refused %d of %d states: %s",
            forecaster.name,
            len(refused),
            len(states),
            "; ".join(refused),
        )
        return out

    @staticmethod
    def _call(forecaster: Forecaster, states: list[WorkflowState]) -> list[Forecast | None]:
        if learns_agents(forecaster):
            answered = list(forecaster.forecast_each(states))  # type: ignore[attr-defined]
            if len(answered) != len(states):
                raise RuntimeError(
                    f"{forecaster.name} returned {len(answered)} forecasts for {len(states)}"
                )
            return answered
        forecasts = np.asarray(forecaster.forecast(states))
        if forecasts.ndim != 3 or forecasts.shape[0] != len(states):
            raise RuntimeError(
                f"{forecaster.name} returned shape {forecasts.shape} for {len(states)} states"
            )
        agents = tuple(forecaster.agents)
        return [Forecast(f, agents) for f in forecasts]

    def online_accuracy(self) -> OnlineAccuracy | None:
        """Return the first online forecaster's prequential accuracy (``None``: none)."""
        for forecaster in self.chain:
            if learns_agents(forecaster):
                return forecaster.accuracy()  # type: ignore[attr-defined, no-any-return]
        return None

    def predictor_statistics(self) -> PredictorStatistics:
        """Return a snapshot of the request, batch and fallback counters."""
        return PredictorStatistics(
            self._requests,
            self._batches,
            self._max_batch,
            self._fallbacks,
            self._failures,
            self._unanswered,
            self._unknown_requests,
            tuple(sorted(self._unknown_agents)),
            self._rejected,
        )
