"""One decoded completion request checked and made ready to run: a :class:`Generation`.

:func:`build_generation` refuses what ``pbkv serve`` does not serve (400
``unsupported_parameter``, :func:`refuse_unserved`), tokenizes the prompt (its size checked
first, :mod:`pbkv.server.prompts`), fits the decode budget to the context length and the GPU
KV tier, and compiles the token constraint of a reply with an output format. A request that
does not fit is refused with a 400 ``context_length_exceeded`` naming the field at fault
(:func:`context_error`, :func:`tier_error`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeAlias

from pbkv.server.errors import APIError
from pbkv.server.hints import Hints
from pbkv.server.prompts import check_size, tokenize
from pbkv.server.responses import ResponsesRequest
from pbkv.server.sampling import request_sampling
from pbkv.server.schemas import ChatCompletionRequest, CompletionRequest
from pbkv.server.toolcalls import ReplyContext, ReplyPlan, ReplySource, simulated_text

TEXT_REPLY = ReplyPlan()  # a text reply: no tools, no format
_ROLES = {"developer": "system"}  # OpenAI's newer name for system messages

Prompt: TypeAlias = str | list[dict[str, Any]]
Request: TypeAlias = ChatCompletionRequest | CompletionRequest | ResponsesRequest


@dataclass(frozen=True, slots=True)
class Generation:
    """One decoded request, ready to run: prompt, budget, sampling and stream options."""

    endpoint: str
    prompt: tuple[Any, ...]  # pbkv.Segment s, templated once here
    prompt_tokens: int
    max_new_tokens: int
    budget_param: str  # the request field the budget came from (max_tokens...)
    sampling: Any
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    inject_fault: bool = False  # ServerConfig.fault_injection: the stop callback raises
    plan: ReplyPlan = TEXT_REPLY  # tools, tool choice and output format (chat)
    simulated: Any = None  # pbkv.Simulated: the reply on an engine that samples no text
    constraint: Any = None  # pbkv.engines.constrained.TokenConstraint of the reply

    @property
    def prompt_param(self) -> str:
        """The request field that holds the prompt."""
        return prompt_param(self.endpoint)


def prompt_param(endpoint: str) -> str:
    """The request field that holds the prompt of ``endpoint`` (``chat``, ``text`` or
    ``responses``)."""
    return {"chat": "messages", "responses": "input"}.get(endpoint, "prompt")


async def build_generation(
    runtime: Any,
    endpoint: str,
    request: Request,
    prompt: Prompt,
    plan: ReplyPlan,
    *,
    default_max_tokens: int,
) -> Generation:
    """Check ``request`` and tokenize its prompt (the size first, see
    :mod:`pbkv.server.prompts`); return what to run.

    Args:
        runtime: the open live runtime (its chat format, engine and KV manager).
        endpoint: ``chat``, ``text`` or ``responses``.
        request: the decoded request.
        prompt: its prompt string or chat messages (:func:`message_dict`).
        plan: its tools, tool choice and output format.
        default_max_tokens: the budget of a request that sets none (less when the
            context length or the GPU KV tier leaves less room).

    Raises:
        APIError: 400 naming the field at fault.
    """
    if request.n != 1:
        raise APIError(400, f"n: only 1 choice is served, got {request.n}", param="n")
    if not isinstance(request, ResponsesRequest):  # chat_view refused what it does not serve
        refuse_unserved(request)
    chat = runtime.chat
    check_size(prompt, prompt_param(endpoint), chat.context_length_tokens, plan.tools)
    segments = await tokenize(chat, prompt, plan.tools)
    prompt_tokens = sum(len(s.token_ids) for s in segments)
    budget_param, budget = "max_tokens", request.max_tokens
    if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens:
        budget_param, budget = "max_completion_tokens", request.max_completion_tokens
    elif isinstance(request, ResponsesRequest):
        budget_param = "max_output_tokens"
    room = chat.context_length_tokens - prompt_tokens
    if room < 1:
        raise context_error(prompt_param(endpoint), prompt_tokens, 1, chat.context_length_tokens)
    if budget is None:  # as OpenAI: what the context leaves, up to the default
        budget = min(default_max_tokens, room)
        tier_room = gpu_tier_tokens(runtime) - prompt_tokens
        if tier_room >= 1:  # and what the GPU tier can hold beside the prompt
            budget = min(budget, tier_room)
    elif budget > room:
        raise context_error(budget_param, prompt_tokens, budget, chat.context_length_tokens)
    options = request.stream_options
    return Generation(
        endpoint=endpoint,
        prompt=segments,
        prompt_tokens=prompt_tokens,
        max_new_tokens=budget,
        budget_param=budget_param,
        sampling=request_sampling(request.temperature, request.top_p, request.seed),
        stops=stop_sequences(request.stop),
        stream=request.stream,
        include_usage=bool(request.stream and options and options.include_usage),
        plan=plan,
        constraint=token_constraint(runtime, plan),
    )


def token_constraint(runtime: Any, plan: ReplyPlan) -> Any:
    """Return the token constraint of a reply with an output format, on an engine that
    samples (``None`` otherwise: the sim emits a schema-valid reply instead).

    Raises:
        APIError: 400 naming the field when the engine cannot constrain its decoding
            or the format does not compile.
    """
    if plan.output_format is None or not runtime.samples_tokens:
        return None
    from pbkv.engines.constrained import (
        ConstraintUnavailable,
        TokenConstraint,
        smollm2_tokenizer,
    )

    param = "response_format" if plan.tool_choice in ("auto", "none") else "tool_choice"
    engine = getattr(runtime, "engine", None)
    if not getattr(engine, "constrains_tokens", False):
        raise APIError(
            400,
            f"{param}: this engine has no constrained decoding",
            param=param,
            code="unsupported_parameter",
        )
    try:
        return TokenConstraint(plan.output_format, smollm2_tokenizer())
    except ConstraintUnavailable as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code="unsupported_parameter") from None
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param=param) from None


def with_simulated_reply(
    runtime: Any,
    generation: Generation,
    hints: Hints,
    prompt: Prompt,
    reply_source: ReplySource | None,
) -> Generation:
    """Return ``generation`` with the sim engine's reply text, where it has one
    (:func:`pbkv.server.toolcalls.simulated_text`)."""
    if runtime.samples_tokens or isinstance(prompt, str):
        return generation
    context = ReplyContext(hints.agent, hints.workflow_id, tuple(prompt), generation.plan)
    text = simulated_text(generation.plan, context, reply_source)
    if text is None:
        return generation
    from pbkv.live import Simulated

    return dataclasses.replace(generation, simulated=Simulated(text=text))


def gpu_tier_tokens(runtime: Any) -> int:
    """Tokens the GPU KV tier holds (0 where the engine's KV manager says none)."""
    kv = getattr(runtime, "kv", None)
    config = getattr(kv, "config", None)
    if config is None:
        return 0
    return int(config.gpu_capacity_blocks) * int(config.block_size)


def stop_sequences(stop: str | list[str] | None) -> tuple[str, ...]:
    """Return a request's ``stop`` as a tuple (at most 4 sequences, as OpenAI).

    Raises:
        APIError: 400 naming ``stop`` for more than 4.
    """
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 4:
        raise APIError(400, f"stop: at most 4 sequences, got {len(stops)}", param="stop")
    return stops


def context_error(param: str, prompt_tokens: int, budget: int, context: int) -> APIError:
    """Return the 400 of a request past the context length, naming the field at fault."""
    return APIError(
        400,
        f"{param}: this model's context length is {context} tokens; the request needs "
        f"{prompt_tokens + budget} ({prompt_tokens} in the prompt, {budget} to generate)",
        param=param,
        code="context_length_exceeded",
    )


def tier_error(exc: Exception, generation: Generation, tier_tokens: int) -> APIError:
    """Return the 400 of a request that can never fit the GPU KV tier, naming the
    prompt, or the budget when the prompt alone would fit.

    Args:
        exc: the engine's refusal.
        generation: the request refused.
        tier_tokens: tokens the GPU KV tier holds (:func:`gpu_tier_tokens`; 0: unknown).
    """
    param = generation.prompt_param
    prompt, budget = generation.prompt_tokens, generation.max_new_tokens
    if not tier_tokens:
        message = f"the request never fits the GPU KV cache tier ({exc})"
    else:
        if prompt + 1 <= tier_tokens:
            param = generation.budget_param
        message = (
            f"the request needs {prompt + budget} tokens of KV cache ({prompt} in the "
            f"prompt, {budget} to generate); the GPU KV cache tier holds {tier_tokens}"
        )
    return APIError(400, f"{param}: {message}", param=param, code="context_length_exceeded")


def message_dict(message: Any) -> dict[str, Any]:
    """Return a request's message as the chat template takes it (role, text, tool calls)."""
    out: dict[str, Any] = {
        "role": _ROLES.get(message.role, message.role),
        "content": message.text(),
    }
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def refuse_unserved(request: ChatCompletionRequest | CompletionRequest) -> None:
    """Refuse a request for what pbkv serve does not do, naming the field (400
    ``unsupported_parameter``): the legacy ``functions`` / ``function_call`` (``tools``
    are served), a ``response_format`` on completions, logprobs, non-zero penalties,
    ``logit_bias``, audio, non-text message parts, and on completions ``echo``,
    ``best_of`` > 1 and ``suffix``. Their neutral values (no functions or
    ``function_call: "none"``, ``{"type": "text"}``, ``false``/0/empty) are accepted."""

    def refuse(param: str, message: str) -> APIError:
        return APIError(
            400,
            f"{param}: {message}; pbkv serve does not serve it",
            param=param,
            code="unsupported_parameter",
        )

    if isinstance(request, ChatCompletionRequest):
        choice = request.function_call
        if choice is not None and choice not in ("none", "auto"):
            raise refuse("function_call", f"function_call {choice!r} (send tools instead)")
        if request.functions and choice != "none":
            raise refuse("functions", "the legacy functions (send tools instead)")
        for i, message in enumerate(request.messages):
            if isinstance(message.content, list):
                for j, part in enumerate(message.content):
                    if part.type != "text":
                        param = f"messages[{i}].content[{j}].type"
                        raise refuse(param, f"a {part.type!r} part (only text is served)")
        if request.modalities and set(request.modalities) - {"text"}:
            raise refuse("modalities", f"modalities {request.modalities!r} (only text)")
    else:
        if request.echo:
            raise refuse("echo", "echoing the prompt")
        if request.best_of is not None and request.best_of > 1:
            raise refuse("best_of", f"best_of {request.best_of}")
        if request.suffix:
            raise refuse("suffix", "a suffix (insertion)")
    kind = (request.response_format or {}).get("type", "text")
    if kind != "text" and not isinstance(request, ChatCompletionRequest):
        raise refuse("response_format", f"response_format {kind!r} on completions")
    if request.logprobs is not None and request.logprobs is not False:
        raise refuse("logprobs", "logprobs")
    if request.top_logprobs:
        raise refuse("top_logprobs", "top_logprobs")
    if request.logit_bias:
        raise refuse("logit_bias", "a logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name):
            raise refuse(name, f"a non-zero {name}")
