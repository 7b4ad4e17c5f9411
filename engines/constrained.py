"""Constrained decoding: what a reply must look like, and the tokens allowed next.

Engine-independent. An :class:`OutputFormat` says a reply must be ``prefix`` + one JSON
value of a JSON schema + ``suffix``: a tool call (``<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>``, the form :mod:`pbkv.live.chat` renders) or a
``response_format`` JSON reply. An engine that samples (torch) masks its logits with a
:class:`TokenConstraint` built from it; one that samples nothing (sim) emits
:meth:`OutputFormat.example`, a schema-valid instance, so framework loops run
deterministically on it.

The grammar library is llguidance (Lark grammar with an embedded ``%json`` schema),
chosen by its per-token cost on CPU (the measured comparison: ``docs/serve.md``). JSON is held to
``json.dumps``'s separators (``", "``, ``": "``, no other whitespace), so a generated tool
call is the text history renders it as, token for token.

A request carries its constraint on its ``on_token`` callback (the live call's
``until``): :func:`request_constraint` finds it there, so the engine needs one hook in
its sampler and no new request field.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_SEPARATORS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """A reply that must be ``prefix`` + one JSON value of ``schema`` + ``suffix``.

    Args:
        schema: a JSON schema (``{"type": "object"}`` for any JSON object).
        prefix / suffix: literal text around the JSON value.
    """

    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    prefix: str = ""
    suffix: str = ""

    def grammar(self) -> str:
        """Return the format as a Lark grammar for llguidance (objects strict, see
        :func:`strict_schema`)."""
        schema = {**strict_schema(self.schema), "x-guidance": _SEPARATORS}
        parts = [json.dumps(p) for p in (self.prefix,) if p]
        parts.append("value")
        parts += [json.dumps(s) for s in (self.suffix,) if s]
        return f"start: {' '.join(parts)}\nvalue: %json {json.dumps(schema)}\n"

    def example(self) -> str:
        """Return a reply text of this format: a schema-valid instance (see
        :func:`schema_example`) serialized as ``json.dumps`` does."""
        value = schema_example(self.schema)
        return self.prefix + json.dumps(value, ensure_ascii=False) + self.suffix


def strict_schema(schema: Any) -> Any:
    """Return ``schema`` with every object that says nothing of ``additionalProperties``
    closed to the properties it lists (xgrammar's default ``strict_mode``, OpenAI's
    ``strict`` tools): a model is held to the keys the schema names."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def tool_call_format(tools: Sequence[Mapping[str, Any]]) -> OutputFormat:
    """Return the format of one call of one of ``tools`` (OpenAI tool definitions):
    ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``, where ARGS
    follows that tool's ``parameters`` schema.

    A tool's ``$defs`` (or ``definitions``, as pydantic writes nested models) move to the
    format's root under ``t{i}.NAME``, and its references with them, so they resolve
    from the root the wrapper gives them.

    Raises:
        ValueError: no tools.
    """
    if not tools:
        raise ValueError("tool_call_format needs at least one tool")
    options, definitions = [], {}
    for i, tool in enumerate(tools):
        function = tool.get("function", tool)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        parameters, defs = _hoisted(parameters, f"t{i}")
        definitions.update(defs)
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if definitions:
        schema = {**schema, "$defs": definitions}
    return OutputFormat(schema, "<tool_call>\n", "\n</tool_call>")


def _hoisted(parameters: Mapping[str, Any], prefix: str) -> tuple[Any, dict[str, Any]]:
    """Return ``parameters`` without its ``$defs``/``definitions`` and those definitions
    renamed ``{prefix}.NAME``, every ``$ref`` to them pointing at the new names under the
    root's ``$defs``; a ``$ref`` to the schema itself (``#``) or into its body
    (``#/properties/p``) points into a copy of the body kept as ``{prefix}``."""
    local = {k: v for k, v in parameters.items() if k not in ("$defs", "definitions")}
    defs = {**parameters.get("definitions", {}), **parameters.get("$defs", {})}
    into_body = _refers_into_body(parameters)
    if not defs and not into_body:
        return parameters, {}

    def moved(node: Any) -> Any:
        if isinstance(node, Mapping):
            out = {k: moved(v) for k, v in node.items()}
            ref = node.get("$ref")
            if isinstance(ref, str):
                out["$ref"] = _moved_ref(ref, prefix)
            return out
        if isinstance(node, list):
            return [moved(v) for v in node]
        return node

    hoisted = {f"{prefix}.{name}": moved(schema) for name, schema in defs.items()}
    body = moved(local)
    if into_body:
        hoisted[prefix] = body
    return body, hoisted


_DEFS_HEADS = ("#/$defs/", "#/definitions/")


def _moved_ref(ref: str, prefix: str) -> str:
    """Return where ``ref`` of a schema hoisted under ``prefix`` points now (a remote or
    ``$id``-relative ref unchanged)."""
    for head in _DEFS_HEADS:
        if ref.startswith(head):
            return f"#/$defs/{prefix}.{ref[len(head) :]}"
    if ref == "#":
        return f"#/$defs/{prefix}"
    if ref.startswith("#/"):
        return f"#/$defs/{prefix}/{ref[2:]}"
    return ref


def _refers_into_body(node: Any) -> bool:
    """Whether a ``$ref`` under ``node`` points at the root schema or into its body (not
    into its definitions)."""
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str) and (
            ref == "#" or (ref.startswith("#/") and not ref.startswith(_DEFS_HEADS))
        ):
            return True
        return any(_refers_into_body(v) for v in node.values())
    if isinstance(node, list):
        return any(_refers_into_body(v) for v in node)
    return False


def json_format(schema: Mapping[str, Any] | None = None) -> OutputFormat:
    """Return the format of a JSON reply: any JSON object, or a value of ``schema``."""
    return OutputFormat(schema if schema is not None else {"type": "object"})


# Schema-valid examples (the sim engine's structured replies)

_STRING_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def schema_example(schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """Return a small value valid under ``schema`` (a JSON schema, as OpenAI tools and
    pydantic write them: ``$ref`` into ``$defs``, ``anyOf``/``oneOf``/``allOf``, ``enum``,
    ``const``, typed objects, arrays, strings, numbers). An object holds its required
    properties (all of them when it lists none as required); a ``pattern`` is not
    followed.

    Raises:
        ValueError: a ``$ref`` that does not point into the schema.
    """
    root = schema if root is None else root
    if "$ref" in schema:
        return schema_example(_resolve(schema["$ref"], root), root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_example(schema[key][0], root)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            part = _resolve(part["$ref"], root) if "$ref" in part else part
            merged = _merge(merged, part)
        return schema_example(merged, root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _EXAMPLES[kind](schema, root)


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not ref.startswith("#"):
        raise ValueError(f"$ref {ref!r}: only references into the schema are followed")
    node: Any = root
    for part in ref.lstrip("#").split("/"):
        if part:
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(a))
    for key, value in b.items():
        if key == "properties":
            merged["properties"] = {**merged.get("properties", {}), **value}
        elif key == "required":
            merged["required"] = [*merged.get("required", []), *value]
        else:
            merged[key] = value
    return merged


def _object(schema: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = schema.get("required")
    names = [n for n in properties if required is None or n in required]
    return {n: schema_example(properties[n], root) for n in names}


def _array(schema: Mapping[str, Any], root: Mapping[str, Any]) -> list[Any]:
    prefix = [schema_example(s, root) for s in schema.get("prefixItems") or ()]
    count = max(schema.get("minItems", 1), len(prefix))
    count = min(count, schema.get("maxItems", count))
    items = schema.get("items")
    if not isinstance(items, Mapping):
        items = {"type": "string"}
    return (prefix + [schema_example(items, root) for _ in range(count)])[:count]


def _string(schema: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    text = _STRING_FORMATS.get(schema.get("format", ""), "text")
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    text = text + "x" * max(0, low - len(text))
    return text if high is None else text[:high]


def _number(schema: Mapping[str, Any], root: Mapping[str, Any]) -> int | float:
    value: float = 1
    if "minimum" in schema:
        value = max(value, schema["minimum"])
    if "exclusiveMinimum" in schema:
        value = max(value, schema["exclusiveMinimum"] + 1)
    if "maximum" in schema:
        value = min(value, schema["maximum"])
    if "exclusiveMaximum" in schema:
        value = min(value, schema["exclusiveMaximum"] - 1)
    return int(value) if schema.get("type") == "integer" or float(value).is_integer() else value


_EXAMPLES: dict[str, Any] = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": _number,
    "number": _number,
    "boolean": lambda schema, root: True,
    "null": lambda schema, root: None,
}


# Token masks (engines that sample)


class ConstraintUnavailable(RuntimeError):
    """The grammar library (``llguidance``, in the ``serve`` extra) is not installed."""


@functools.cache
def _tokenizer(tokenizer_json: str, eos_token: int) -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise ConstraintUnavailable(
            "constrained decoding needs llguidance (pip install 'pbkv[serve]')"
        ) from exc
    return llguidance.LLTokenizer(tokenizer_json, eos_token=eos_token)


def smollm2_tokenizer() -> Any:
    """Return the llguidance tokenizer of SmolLM2's vocabulary (the live runtime's),
    built once (about half a second), ``<|im_end|>`` as its end of sequence.

    Raises:
        ConstraintUnavailable: llguidance is not installed.
    """
    from pbkv.assets import encode, load_tokenizer

    [eos] = encode("<|im_end|>")
    return _tokenizer(load_tokenizer().to_str(), eos)


class TokenConstraint:
    """The tokens one reply may take next under an :class:`OutputFormat`.

    Once the format is complete only the end-of-sequence token is allowed, so the reply
    ends there. Not thread-safe: one reply, one sampler.

    Args:
        output_format: what the reply must be.
        tokenizer: an llguidance tokenizer (:func:`smollm2_tokenizer`).

    Raises:
        ValueError: the format's schema is not one llguidance compiles (its message).
        ConstraintUnavailable: llguidance is not installed.
    """

    def __init__(self, output_format: OutputFormat, tokenizer: Any) -> None:
        import llguidance
        import llguidance.numpy as llnumpy

        self.output_format = output_format
        grammar = llguidance.LLMatcher.grammar_from_lark(output_format.grammar())
        self._matcher = llguidance.LLMatcher(tokenizer, grammar)
        if self._matcher.is_error():
            raise ValueError(f"the output format does not compile: {self._matcher.get_error()}")
        self._vocab = tokenizer.vocab_size
        self._bits = llnumpy.allocate_token_bitmask(1, self._vocab)
        self._fill = llnumpy.fill_next_token_bitmask
        self._consumed = 0

    def _sync(self, token_ids: Sequence[int]) -> None:
        """Consume the tokens of ``token_ids`` not consumed yet.

        Raises:
            ValueError: a token the format does not allow (it was not sampled under
                this constraint).
        """
        for token in token_ids[self._consumed :]:
            if not self._matcher.consume_token(int(token)):
                error = self._matcher.get_error()
                raise ValueError(f"token {token} breaks the output format: {error}")
            self._consumed += 1

    def allowed(self, token_ids: Sequence[int]) -> Any:
        """Return which tokens may follow ``token_ids`` (the reply so far).

        Shapes:
            Returns a bool tensor ``(vocab,)`` of the tokenizer's vocabulary.
        """
        import torch

        self._sync(token_ids)
        self._fill(self._matcher, self._bits, 0)
        words = torch.from_numpy(self._bits[0].view("uint8")).unsqueeze(1)
        bits = (words >> torch.arange(8, dtype=torch.uint8)) & 1
        return bits.flatten()[: self._vocab].bool()

    def mask_logits(self, token_ids: Sequence[int], logits: Any) -> Any:
        """Return ``logits`` with the tokens that may not follow ``token_ids`` at ``-inf``
        (ids past the tokenizer's vocabulary too). Does not modify ``logits``.

        Shapes:
            logits: ``(vocab_model,)``; returns the same shape.
        """
        import torch

        allowed = self.allowed(token_ids).to(logits.device)
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        n = min(len(allowed), logits.shape[-1])
        keep[:n] = allowed[:n]
        return logits.masked_fill(~keep, float("-inf"))


def request_constraint(request: Any) -> TokenConstraint | None:
    """Return the :class:`TokenConstraint` an engine request carries, or ``None``.

    A live call's ``until`` travels as the request's ``on_token`` callback (a method of
    the live call, whose ``until`` it forwards to); a constrained call's ``until`` has a
    ``constraint`` attribute. This is the engine's one hook: its sampler masks the logits
    with the constraint it finds.

    Args:
        request: a :class:`pbkv.engines.base.GenerateRequest`.
    """
    callback = getattr(request, "on_token", None)
    owner = getattr(callback, "__self__", None)
    for holder in (callback, getattr(owner, "until", None)):
        found = getattr(holder, "constraint", None)
        if isinstance(found, TokenConstraint):
            return found
    return None
