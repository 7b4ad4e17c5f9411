"""The oracle forecaster: the true future from the workflow script (§6).

It gives the perfect-prediction bound: every row is one-hot on the agent that really
runs at that step, and on ``END`` from the step after the last one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pbkv.predictor.base import WorkflowState
from pbkv.predictor.vocab import agent_index, check_path


class OracleForecaster:
    """Forecast each workflow's true next ``K`` steps.

    Args:
        agents: the agent vocabulary, in column order (``END`` is appended).
        horizon: ``K``, steps forecast.
        workflows: ``workflow_id -> full agent path`` of every workflow it will be asked
            about.

    Raises:
        ValueError: a bad vocabulary or ``horizon``, or a path naming an unknown agent.
    """

    name = "oracle"

    def __init__(
        self,
        agents: Sequence[str],
        *,
        horizon: int,
        workflows: Mapping[str, Sequence[str]],
    ) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.agents: tuple[str, ...] = tuple(agents)
        self.horizon = horizon
        self._index = agent_index(self.agents)
        self._paths: dict[str, tuple[str, ...]] = {}
        for workflow_id, path in workflows.items():
            check_path(self._index, path)
            self._paths[workflow_id] = tuple(path)

    def forecast(self, states: Sequence[WorkflowState]) -> np.ndarray:
        """Return the one-hot true future of each workflow.

        Step ``t+k`` (``t = len(path)``) is one-hot on the ``(t+k)``-th agent of the full
        path, or on ``END`` when the full path has fewer steps.

        Args:
            states: one per workflow; ``workflow_id`` selects the full path and ``path``
                must be a prefix of it.

        Returns:
            float64 array, shape ``(len(states), K, |V|+1)``; each row is one-hot.

        Raises:
            ValueError: an unknown ``workflow_id``, or a path that is empty, names an
                unknown agent or is not a prefix of the workflow's full path.
        """
        out = np.zeros((len(states), self.horizon, len(self.agents) + 1))
        for b, state in enumerate(states):
            full = self._full_path(state)
            for k in range(self.horizon):
                step = len(state.path) + k
                column = self._index[full[step]] if step < len(full) else len(self.agents)
                out[b, k, column] = 1.0
        return out

    def _full_path(self, state: WorkflowState) -> tuple[str, ...]:
        full = self._paths.get(state.workflow_id)
        if full is None:
            raise ValueError(f"oracle knows no workflow {state.workflow_id!r}")
        check_path(self._index, state.path)
        if tuple(state.path) != full[: len(state.path)]:
            raise ValueError(
                f"workflow {state.workflow_id!r}: path {state.path} is not a prefix of {full}"
            )
        return full
