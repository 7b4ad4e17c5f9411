"""The bundled-app interface and the registry of apps by name (§8).

An app is a call graph (its agents, the agents a workflow may start with, and the
admissible transitions, ``END`` included) plus a generator of workflows with real token
ids. Apps register a factory under their name; :func:`get_app` builds one. The generated
apps build on :class:`SeededApp` (workflow ``i`` drawn from ``(seed, i)`` alone) and, when
they route each task through a dynamic call graph, on :class:`RoutedApp`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from pbkv.actors.workload import Step, Workflow
from pbkv.examples.sampling import spawn_rngs
from pbkv.predictor.trace import END


@runtime_checkable
class App(Protocol):
    """A bundled multi-agent app.

    Attributes:
        name: registry name; also ``Workflow.app`` of what it generates.
        agents: the call graph's nodes (``END`` excluded), in a fixed order.
        entry_agents: the agents a workflow may start with.
        edges: admissible ``(source, target)`` transitions; ``target`` may be ``END``.
    """

    name: str
    agents: tuple[str, ...]
    entry_agents: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]

    def generate(self, n_workflows: int, seed: int) -> list[Workflow]:
        """Generate ``n_workflows`` workflows, the same ones for the same ``seed``.

        Workflow ids are ``f"{name}-{seed}-{i}"`` for ``i`` in ``range(n_workflows)``.

        Raises:
            ValueError: ``n_workflows`` is negative.
        """
        ...


AppFactory = Callable[[], App]
_REGISTRY: dict[str, AppFactory] = {}


def register_app(name: str, factory: AppFactory) -> None:
    """Make ``get_app(name)`` build an app with ``factory``.

    Raises:
        ValueError: ``name`` is empty or already registered.
    """
    if not name:
        raise ValueError("app name must not be empty")
    if name in _REGISTRY:
        raise ValueError(f"app {name!r} is already registered")
    _REGISTRY[name] = factory


def app_names() -> tuple[str, ...]:
    """Return the registered app names, sorted."""
    return tuple(sorted(_REGISTRY))


def get_app(name: str) -> App:
    """Build the app registered as ``name``.

    Raises:
        ValueError: no app has that name (the message lists the known ones).
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown app {name!r}; known apps: {', '.join(app_names())}")
    return factory()


def validate_path(app: App, path: Sequence[str]) -> None:
    """Check that a finished workflow's agent path is a walk of ``app``'s call graph.

    The path must start at an entry agent, take only edges, and end with an edge to
    ``END``.

    Raises:
        ValueError: ``path`` is empty or breaks one of those rules (the message says where).
    """
    if not path:
        raise ValueError("path must hold at least one agent")
    if path[0] not in app.entry_agents:
        raise ValueError(f"path starts at {path[0]!r}, not an entry agent {app.entry_agents}")
    edges = set(app.edges)
    for i, (source, target) in enumerate(zip(path, (*path[1:], END), strict=True)):
        if (source, target) not in edges:
            raise ValueError(f"step {i}: transition {source!r} -> {target!r} is not an edge")


def check_count(n_workflows: int) -> None:
    """Raise ``ValueError`` when ``n_workflows`` is negative or not an int."""
    if isinstance(n_workflows, bool) or not isinstance(n_workflows, int) or n_workflows < 0:
        raise ValueError(f"n_workflows must be a non-negative int, got {n_workflows!r}")


class Task(Protocol):
    """What a workflow records of the task a generated app drew."""

    @property
    def task_id(self) -> str: ...

    @property
    def text(self) -> str: ...

    def features(self) -> dict[str, float | str]:
        """Return the hidden features, as ``Workflow.task_features``."""
        ...


class SeededApp(ABC):
    """Base of the generated apps, whose workflow ``i`` depends only on ``(seed, i)``.

    Subclasses set the :class:`App` attributes and define :meth:`generate_one`.
    """

    name: str

    def generate(self, n_workflows: int, seed: int) -> list[Workflow]:
        """Generate ``n_workflows`` workflows; workflow ``i`` depends only on ``(seed, i)``.

        Raises:
            ValueError: ``n_workflows`` or ``seed`` is negative.
        """
        check_count(n_workflows)
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return [self.generate_one(seed, i) for i in range(n_workflows)]

    @abstractmethod
    def generate_one(self, seed: int, index: int) -> Workflow:
        """Generate workflow ``index`` of the workload drawn with ``seed``."""

    def build_workflow(
        self, seed: int, index: int, task: Task, steps: tuple[Step, ...], end_reason: str
    ) -> Workflow:
        """Return workflow ``index`` of ``seed``: ``task``'s ``steps``, ended for ``end_reason``."""
        return Workflow(
            workflow_id=f"{self.name}-{seed}-{index}",
            app=self.name,
            task_id=task.task_id,
            task_text=task.text,
            steps=steps,
            task_features=task.features(),
            end_reason=end_reason,
        )


TaskT = TypeVar("TaskT", bound=Task)


class RoutedApp(SeededApp, Generic[TaskT]):
    """Base of the generated apps that route each task through a dynamic call graph.

    A workflow draws its task, its path and its steps' outputs from three streams of its
    own (:func:`pbkv.examples.sampling.spawn_rngs`); subclasses define the three draws.
    """

    def generate_one(self, seed: int, index: int) -> Workflow:
        """Generate workflow ``index`` of the workload drawn with ``seed``."""
        task_rng, route_rng, output_rng = spawn_rngs(seed, index, 3)
        task = self.sample_task(task_rng, f"{seed}-{index}")
        path, end_reason = self.sample_path(task, route_rng)
        return self.build_workflow(
            seed, index, task, self.build_steps(task, path, end_reason, output_rng), end_reason
        )

    @abstractmethod
    def sample_task(self, rng: np.random.Generator, task_id: str) -> TaskT:
        """Draw a task with id ``task_id``: its hidden features, then its text."""

    @abstractmethod
    def sample_path(self, task: TaskT, rng: np.random.Generator) -> tuple[tuple[str, ...], str]:
        """Route ``task``: return its agent path and end reason."""

    @abstractmethod
    def build_steps(
        self, task: TaskT, path: tuple[str, ...], end_reason: str, rng: np.random.Generator
    ) -> tuple[Step, ...]:
        """Build the steps of ``path``, whose outputs are drawn from ``rng``."""
