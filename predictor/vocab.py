"""Agent vocabularies: the column order shared by every forecast (§6).

A vocabulary is the app's agents in a fixed order; ``END`` is not an agent and always
takes the column after the last agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pbkv.predictor.trace import END


def agent_index(agents: Iterable[str]) -> dict[str, int]:
    """Map each agent to its forecast column; ``END`` maps to ``len(agents)``.

    Args:
        agents: the agent names, in column order.

    Returns:
        ``{agent: column}`` including ``END``.

    Raises:
        ValueError: ``agents`` is empty, repeats a name, or contains ``END`` or ``""``.
    """
    names = tuple(agents)
    if not names:
        raise ValueError("agents must name at least one agent")
    index: dict[str, int] = {}
    for name in names:
        if not name or name == END:
            raise ValueError(f"agents may not contain {name!r}")
        if name in index:
            raise ValueError(f"agents names {name!r} twice")
        index[name] = len(index)
    index[END] = len(names)
    return index


def check_path(index: dict[str, int], path: Sequence[str]) -> None:
    """Check that ``path`` is a non-empty run of known agents.

    Args:
        index: a vocabulary from :func:`agent_index`.
        path: the agents executed so far.

    Raises:
        ValueError: ``path`` is empty or names an unknown agent (or ``END``).
    """
    if not path:
        raise ValueError("path must hold at least the current agent")
    for name in path:
        check_agent(index, name)


def check_agent(index: dict[str, int], agent: str, *, allow_end: bool = False) -> int:
    """Return ``agent``'s column, checking that it belongs to the vocabulary.

    Args:
        index: a vocabulary from :func:`agent_index`.
        agent: the name to look up.
        allow_end: whether ``END`` is accepted (as a next step, never as a path element).

    Returns:
        The agent's column.

    Raises:
        ValueError: ``agent`` is unknown, or is ``END`` while ``allow_end`` is false.
    """
    column = index.get(agent)
    if column is None or (agent == END and not allow_end):
        known = ", ".join(a for a in index if a != END)
        raise ValueError(f"unknown agent {agent!r}; known agents: {known}")
    return column
