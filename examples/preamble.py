"""The shared system preamble of a generated app: intro, guidelines, tools and protocol."""

from __future__ import annotations

from typing import NamedTuple


class ToolSpec(NamedTuple):
    """One tool the agents may call, as the preamble documents it."""

    name: str
    summary: str
    params: tuple[tuple[str, str, str], ...]  # (name, type, meaning)
    returns: str
    example: str


Guidelines = tuple[tuple[str, tuple[str, ...]], ...]
"""Sections of rules: ``(title, rules)`` pairs."""


def render_preamble(
    intro: str,
    guidelines_title: str,
    guidelines: Guidelines,
    tools: tuple[ToolSpec, ...],
    protocol: str,
) -> str:
    """Return the preamble every agent of an app sees first, as plain text.

    Args:
        intro: what the team is and how it works.
        guidelines_title: the heading above the guideline sections.
        guidelines: the rules, by section.
        tools: the tools the agents may call, documented with an example call each.
        protocol: how to respond.
    """
    parts = [intro, "", f"## {guidelines_title}"]
    for title, rules in guidelines:
        parts.append(f"### {title}")
        parts.extend(f"- {rule}" for rule in rules)
    parts += ["", "## Tools", "You can call these tools. Arguments are JSON values."]
    for tool in tools:
        parts.append(f"### {tool.name}\n{tool.summary}\nParameters:")
        parts.extend(f"- `{name}` ({kind}): {meaning}" for name, kind, meaning in tool.params)
        parts.append(f"Returns: {tool.returns}.\nExample:\n{tool.example}")
    parts += ["", protocol]
    return "\n".join(parts)
