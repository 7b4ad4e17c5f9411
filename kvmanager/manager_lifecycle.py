"""Lifecycle events into the KV manager: workflows start, forecast, invoke, end (§4).

The KV-manager actor feeds these; each reaches the score board and whichever tracker
the policy runs (time weights, KVFlow, Belady, Continuum, survival). A malformed
forecast is refused here, at the boundary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from pbkv.kvmanager.manager_state import ManagerState

log = logging.getLogger(__name__)


class ManagerLifecycle(ManagerState):
    """The lifecycle events of :class:`~pbkv.kvmanager.manager.KVManager`."""

    def on_workflow_started(self, workflow_id: str) -> None:
        """Register an active workflow."""
        self.scores.start(workflow_id)

    def on_forecast(self, workflow_id: str, forecast: np.ndarray, agents: Sequence[str]) -> int:
        """Refresh the scores of ``workflow_id``'s nodes from a ``(K, |V|+1)`` forecast.

        A malformed forecast (wrong shape, not finite, negative, rows not summing to 1;
        see :func:`~pbkv.kvmanager.scoring.validate_forecast`) is rejected here, at the
        boundary: it is counted (``rejected_forecasts``), logged, and the workflow keeps
        its last scores, so nothing malformed ever reaches an eviction key.

        Returns:
            Nodes refreshed: 0 for a rejected forecast, or when the policy does not use
            forecasts.
        """
        if not self.policy.uses_forecasts:
            return 0
        try:
            if len(forecast) > self.config.horizon:
                forecast = forecast[: self.config.horizon]
            return self.scores.set_forecast(workflow_id, forecast, agents)
        except (ValueError, TypeError, IndexError) as exc:
            self._counters.rejected_forecasts += 1
            log.warning("rejected forecast for workflow %s: %s", workflow_id, exc)
            return 0

    def on_agent_invoked(self, workflow_id: str, agent: str, step: int) -> None:
        """Note that ``workflow_id`` runs ``agent`` as its ``step``-th invocation (baselines)."""
        self.scores.note_invocation(workflow_id, agent)
        if self.timing is not None:
            self.timing.on_invoked(workflow_id)
        if self.kvflow is not None:
            self.kvflow.on_agent_invoked(workflow_id, agent)
        if self.belady is not None:
            self.belady.on_agent_invoked(workflow_id, step)
        if self.continuum is not None:
            self.continuum.on_agent_invoked(workflow_id)
        if self.survival is not None:
            self.survival.on_agent_invoked(workflow_id, agent)

    def on_workflow_terminated(self, workflow_id: str) -> None:
        """Retire the workflow: its private nodes become retired cache."""
        if self.survival is not None:
            self.survival.on_terminated(workflow_id)  # reads its nodes: before terminate
        self.scores.terminate(workflow_id)
        if self.timing is not None:
            self.timing.on_terminated(workflow_id)
        if self.kvflow is not None:
            self.kvflow.on_terminated(workflow_id)
        if self.belady is not None:
            self.belady.on_terminated(workflow_id)
        if self.continuum is not None:
            self.continuum.on_terminated(workflow_id)
