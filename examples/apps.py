"""The bundled-app interface and the registry of apps by name (§8).

An app is a call graph (its agents, the agents a workflow may start with, and the
admissible transitions, ``END`` included) plus a generator of workflows with real token
ids. Apps register a factory under their name; :func:`get_app` builds one. The bundled
apps are :class:`pbkv.live.App` graphs, whose ``generate`` is the dry run of the graph
with its simulated replies (:func:`pbkv.live.simulate_workflow`), so the workloads of
the studies and the live runs come from one definition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from pbkv.actors.workload import Workflow
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
