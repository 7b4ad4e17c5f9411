"""The forecast interface every predictor implements (§6).

A forecast for one workflow is a ``(K, |V|+1)`` array: row ``k-1`` is the distribution
of the agent that runs at step ``t+k`` *given that the workflow is still running before
that step*, over the app's agents in :attr:`Forecaster.agents` order and ``END`` in the
last column. With this convention the survival of paper Eq. 3,
``s^(k) = prod_{j<k} (1 - P^(j)[END])``, is exactly the probability that the workflow
is still alive at step ``t+k``, and ``s^(k) * P^(k)[a]`` is the marginal probability that
step ``t+k`` runs agent ``a``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class WorkflowState:
    """What a predictor may see of one running workflow.

    Args:
        workflow_id: the workflow's id (the oracle looks its future up by it).
        app: the app's registry name.
        path: the agents executed so far, oldest first; the last one is the current agent.
        task_text: the task as the agents see it.
        hidden: the engine's post-norm hidden state of the last prefill token, shape
            ``(d_model,)``, or ``None`` when the engine gives none.
        context_tail: the text of the latest message(s) of the current step's prompt, or
            ``""`` when unknown.
        tenant: the workflow's tenant (cache salt); online models learn per app and tenant.
    """

    workflow_id: str
    app: str
    path: tuple[str, ...]
    task_text: str = ""
    hidden: np.ndarray | None = None
    context_tail: str = ""
    tenant: str = ""


class Forecast(NamedTuple):
    """One workflow's forecast with the columns it is over.

    Attributes:
        probabilities: float64, shape ``(K, len(agents) + 1)``; row ``k-1`` is step
            ``t+k``'s distribution given the workflow is alive before it, ``END`` last.
        agents: the column order (a fixed forecaster's vocabulary, or an online one's
            app vocabulary as it stood).
    """

    probabilities: np.ndarray
    agents: tuple[str, ...]


@runtime_checkable
class Forecaster(Protocol):
    """A K-step agent predictor.

    Attributes:
        name: registry name.
        agents: the agent vocabulary, in column order; ``END`` is column ``len(agents)``.
        horizon: ``K``, the number of future steps forecast.
    """

    name: str
    agents: tuple[str, ...]
    horizon: int

    def forecast(self, states: Sequence[WorkflowState]) -> np.ndarray:
        """Forecast the next ``K`` steps of each workflow.

        Args:
            states: one state per workflow; ``path`` must be non-empty.

        Returns:
            float64 array, shape ``(len(states), K, len(agents) + 1)``; each row sums to 1.

        Raises:
            ValueError: a state's path is empty or names an agent outside ``agents``.
        """
        ...
