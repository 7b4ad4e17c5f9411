"""What a chat request asks of its reply: tools, ``tool_choice`` and ``response_format``.

Plain code, no trio. :func:`reply_plan` checks a request's ``tools``, ``tool_choice``,
``parallel_tool_calls`` and ``response_format`` and says how to serve them, as vLLM and
SGLang do: the tools are rendered into the prompt by the chat template
(:mod:`pbkv.live.chat`) whatever the choice, so a conversation's prefix does not change
with it; ``auto`` (the default with tools) parses the reply with the server's
tool-call parser (:mod:`pbkv.server.toolparsers`); ``required`` and a named function
constrain the reply to one tool call (:func:`pbkv.engines.constrained.tool_call_format`),
and ``response_format`` ``json_object`` / ``json_schema`` to JSON; ``none`` leaves the
reply as text. A scripted reply source (:class:`ReplyContext`) lets the sim engine,
which samples no text, answer as a model would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pbkv.engines.constrained import OutputFormat, json_format, tool_call_format
from pbkv.server.errors import APIError


@dataclass(frozen=True, slots=True)
class ReplyPlan:
    """How to serve one chat request's tools and formats.

    Args:
        tools: the tool definitions rendered into the prompt.
        tool_choice: ``none``, ``auto``, ``required`` or the named function.
        parse_calls: read tool calls out of the reply (the tool-call parser).
        output_format: the format the reply is constrained to, if any.
    """

    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "none"
    parse_calls: bool = False
    output_format: OutputFormat | None = None


def _checked_tools(tools: Sequence[Mapping[str, Any]] | None) -> tuple[Mapping[str, Any], ...]:
    """Return the tools if each is an OpenAI function tool with a name.

    Raises:
        APIError: 400 naming the first malformed tool.
    """
    for i, tool in enumerate(tools or ()):
        function = tool.get("function")
        if tool.get("type", "function") != "function":
            raise APIError(
                400,
                f"tools[{i}].type: only 'function' tools are served, got {tool.get('type')!r}",
                param=f"tools[{i}].type",
                code="unsupported_parameter",
            )
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise APIError(
                400, f"tools[{i}].function.name: a string is required", param=f"tools[{i}].function"
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise APIError(
                400,
                f"tools[{i}].function.parameters: must be a JSON schema object",
                param=f"tools[{i}].function.parameters",
            )
    return tuple(tools or ())


def _choice(tool_choice: str | Mapping[str, Any] | None, tools: Sequence[Any]) -> str:
    """Return the choice as ``none``, ``auto``, ``required`` or ``function:NAME``.

    Raises:
        APIError: 400 naming ``tool_choice`` for an unknown choice, one that needs tools
            when none are given, or a named function that is not among them.
    """
    if tool_choice is None:
        return "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise APIError(
                400,
                f"tool_choice: expected none, auto, required or a function, got {tool_choice!r}",
                param="tool_choice",
            )
        if tool_choice == "required" and not tools:
            raise APIError(400, "tool_choice: 'required' needs tools", param="tool_choice")
        return tool_choice
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
    if not isinstance(name, str):
        raise APIError(
            400,
            "tool_choice: a named choice is {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if name not in {t["function"]["name"] for t in tools}:
        raise APIError(400, f"tool_choice: no tool named {name!r} is given", param="tool_choice")
    return f"function:{name}"


def _response_format(response_format: Mapping[str, Any] | None) -> OutputFormat | None:
    """Return the JSON format ``response_format`` asks for (``None`` for text).

    Raises:
        APIError: 400 naming ``response_format`` for an unknown type or a
            ``json_schema`` without a schema object.
    """
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_format()
    if kind == "json_schema":
        spec = response_format.get("json_schema") if response_format else None
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise APIError(
                400,
                "response_format.json_schema.schema: a JSON schema object is required",
                param="response_format.json_schema.schema",
            )
        return json_format(schema)
    raise APIError(
        400,
        f"response_format: expected text, json_object or json_schema, got {kind!r}",
        param="response_format",
        code="unsupported_parameter",
    )


def reply_plan(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    response_format: Mapping[str, Any] | None,
) -> ReplyPlan:
    """Check a request's tool and format fields; return how to serve them.

    A tool choice that constrains (``required``, a named function) wins over
    ``response_format``, as the reply is then a tool call.

    Raises:
        APIError: 400 naming the field at fault.
    """
    listed = _checked_tools(tools)
    choice = _choice(tool_choice, listed)
    formatted = _response_format(response_format)
    if choice == "required":
        formatted = tool_call_format(listed)
    elif choice.startswith("function:"):
        name = choice.removeprefix("function:")
        formatted = tool_call_format([t for t in listed if t["function"]["name"] == name])
    return ReplyPlan(
        listed, choice, parse_calls=choice != "none" and bool(listed), output_format=formatted
    )


@dataclass(frozen=True, slots=True)
class ReplyContext:
    """What a scripted reply source sees of a request (sim engine).

    Args:
        agent / workflow_id: who calls (the resolved hints; ``None``: one-request).
        messages: the request's messages as OpenAI dicts (``tool_calls`` included).
        plan: its tools, tool choice and output format.
    """

    agent: str
    workflow_id: str | None
    messages: tuple[Mapping[str, Any], ...]
    plan: ReplyPlan


ReplySource = Callable[[ReplyContext], str | None]
"""Returns a reply's text (a tool call written as the template writes it, e.g.
:func:`pbkv.live.chat.tool_call_text`), or ``None`` for the sim's own reply."""


def simulated_text(
    plan: ReplyPlan, context: ReplyContext, source: ReplySource | None
) -> str | None:
    """Return the text the sim engine replies with: the scripted source's, else a
    schema-valid instance of the plan's output format, else ``None`` (filler)."""
    if source is not None:
        text = source(context)
        if text is not None:
            return text
    if plan.output_format is not None:
        return plan.output_format.example()
    return None
