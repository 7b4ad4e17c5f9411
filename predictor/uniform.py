"""The uniform forecaster: no information, every step uniform over agents and ``END``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pbkv.predictor.base import WorkflowState
from pbkv.predictor.vocab import agent_index, check_path


class UniformForecaster:
    """Forecast ``1 / (|V|+1)`` for every agent and ``END`` at every step.

    Args:
        agents: the agent vocabulary, in column order (``END`` is appended).
        horizon: ``K``, steps forecast.

    Raises:
        ValueError: a bad vocabulary or ``horizon``.
    """

    name = "uniform"

    def __init__(self, agents: Sequence[str], *, horizon: int) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.agents: tuple[str, ...] = tuple(agents)
        self.horizon = horizon
        self._index = agent_index(self.agents)

    def forecast(self, states: Sequence[WorkflowState]) -> np.ndarray:
        """Return uniform rows for each workflow.

        Args:
            states: one per workflow; paths are only checked.

        Returns:
            float64 array, shape ``(len(states), K, |V|+1)``, every entry ``1/(|V|+1)``.

        Raises:
            ValueError: a path is empty or names an unknown agent.
        """
        for state in states:
            check_path(self._index, state.path)
        width = len(self.agents) + 1
        return np.full((len(states), self.horizon, width), 1.0 / width)
