"""The bundled-app interface and the registry of apps by name (§8).

An app is a call graph (its agents, the agents a workflow may start with, and the
admissible transitions, ``END`` included) plus a generator of workflows with real token
ids. Apps register a factory under their name; :func:`get_app` builds one. The bundled
apps are :class:`pbkv.live.App` graphs, whose ``generate`` is the dry run of the graph
with its simulated replies (:func:`pbkv.live.simulate_workflow`), so the workloads of
the studies and the live runs come from one definition.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from pbkv.actors.workload import Workflow
from pbkv.examples.gaps import GAP_MODELS
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


def get_app(name: str, *, gap_model: str = "bundled") -> App:
    """Build the app registered as ``name``, or load a user's app ``"module:attribute"``
    (see :func:`load_app`).

    Args:
        name: a registered name or ``"module:attribute"``.
        gap_model: the tool and user gaps the app draws (:mod:`pbkv.examples.gaps`):
            ``bundled`` (its own) or ``cited`` (documented distributions; bundled apps
            only).

    Raises:
        ValueError: no app has that name (the message lists the known ones); the app
            takes no gap model and ``gap_model`` is not ``bundled``; or as
            :func:`load_app`.
    """
    if gap_model not in GAP_MODELS:
        raise ValueError(f"unknown gap model {gap_model!r}; known: {', '.join(GAP_MODELS)}")
    if ":" in name:
        if gap_model != "bundled":
            raise ValueError(f"app {name!r}: gap model {gap_model!r} is for the bundled apps")
        return load_app(name)
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown app {name!r}; known apps: {', '.join(app_names())}")
    if gap_model == "bundled":
        return factory()
    if "gap_model" not in inspect.signature(factory).parameters:
        raise ValueError(f"app {name!r} draws no gaps to cite (gap model {gap_model!r})")
    return factory(gap_model=gap_model)  # type: ignore[call-arg]


def load_app(spec: str) -> App:
    """Load the app ``"module:attribute"`` names from an importable module.

    The attribute is a :class:`pbkv.live.App` (or any object with the :class:`App`
    attributes and ``generate``), or a callable without arguments that returns one
    (a class or factory). A graph app is validated; one without a task source works on
    default tasks (:meth:`pbkv.live.App.task`).

    Raises:
        ValueError: ``spec`` is not ``module:attribute``, the module cannot be imported,
            it has no such attribute, the attribute (or what it returned) is not an
            app, or the graph is invalid (each names the part).
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"app {spec!r}: expected 'module:attribute', such as 'my_app:app'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"app {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"app {spec!r}: module {module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type) or (not isinstance(obj, App) and callable(obj)):
        obj = obj()  # a class is instantiated even when its class attributes look like an app
    if not isinstance(obj, App):
        raise ValueError(
            f"app {spec!r}: {module_name}.{attribute} is a {type(obj).__name__}, not an app "
            "(a pbkv.live.App, or an object with name, agents, entry_agents, edges and "
            "generate(n_workflows, seed))"
        )
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


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
