"""The graph executor: one workflow of an app, superstep by superstep (§4, live graph API).

:func:`execute` runs the frontier's nodes (concurrently when the caller is live), appends
each node's turn to the state, and routes to the next frontier until ``END``, a node's
``max_visits`` or the app's ``recursion_limit``. It calls agents through a
:class:`Caller`: a live session (:mod:`~pbkv.live.driver`) or a dry run
(:mod:`~pbkv.live.dry_run`). An agent's call that the engine fails is retried up to the
agent's ``max_retries``; an error of the app's own code is a
:class:`~pbkv.live.errors.NodeFailed`.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from pbkv.actors.events import TerminationReason
from pbkv.actors.workload import Segment
from pbkv.engines.base import Sampling
from pbkv.live.call import CallFailed, Reply
from pbkv.live.chat import ChatFormat
from pbkv.live.errors import NodeFailed
from pbkv.live.graph import END, App, State, ToolNode, ToolResult, Turn
from pbkv.live.prompts import agent_call_prompt, encoded
from pbkv.live.simulated import Simulated
from pbkv.runtime import now_s

log = logging.getLogger(__name__)


class Caller(Protocol):
    """What the executor calls agents through: a live session or a dry run."""

    samples_tokens: bool
    concurrent: bool
    """Whether a fan-out's branches run concurrently (live); a dry run takes them one by
    one in frontier order, so its script is the same in every process."""

    async def call(
        self,
        agent: str,
        prompt: Sequence[Segment],
        *,
        max_new_tokens: int,
        sampling: Sampling,
        simulated: Simulated | None,
        context_tail: str,
        step: int | None,
    ) -> Reply: ...

    async def sleep(self, seconds: float) -> None:
        """Spend a tool's modelled latency (virtual time on the sim engine)."""


@dataclass(slots=True)
class GraphRun:
    """One workflow's walk of ``app``: its caller, its state, and the replies and path
    (agents called, in order) so far. Mutated by :func:`execute`."""

    app: App
    chat: ChatFormat
    caller: Caller
    state: State
    replies: list[Reply]
    path: list[str]


async def execute(run: GraphRun) -> TerminationReason:
    """Run ``run.app`` on ``run.state`` superstep by superstep; return the end reason.

    Raises:
        CallFailed: a call failed past its agent's retries.
        NodeFailed: a router, prompt builder, tool or simulated reply raised (chained).
        TypeError / ValueError: one returned what the graph cannot use (a router a
            node it did not declare), the node named.
    """
    app, state = run.app, run.state
    frontier = list(app.entry_nodes)
    for _ in range(app.recursion_limit):
        frontier = [n for n in dict.fromkeys(frontier) if n != END]
        if not frontier:
            return "end"
        for name in frontier:
            cap = app.nodes[name].max_visits
            if cap is not None and state.visits[name] >= cap:
                return "recursion_limit"
        outputs = await _run_superstep(run, frontier)
        nxt: list[str] = []
        for name, out in zip(frontier, outputs, strict=True):
            assert out is not None
            state.visits[name] += 1
            state.turns.append(_turn(run, name, out))
            nxt += _successors(app, state, name, out)
        frontier = nxt
    frontier = [n for n in frontier if n != END]
    return "recursion_limit" if frontier else "end"


async def _run_superstep(run: GraphRun, frontier: list[str]) -> list[Reply | ToolResult | None]:
    """Run the frontier's nodes concurrently (fan-out); return their outputs in order.

    The first branch that raises cancels the others, and its error is raised as it is
    (not wrapped in an exception group, so the workflow's error names its node).
    """
    outputs: list[Reply | ToolResult | None] = [None] * len(frontier)
    if len(frontier) == 1 or not run.caller.concurrent:
        for i, name in enumerate(frontier):
            outputs[i] = await _run_node(run, name)
        return outputs
    failed: list[Exception] = []

    async def one(i: int, name: str, cancel: trio.CancelScope) -> None:
        try:
            outputs[i] = await _run_node(run, name)
        except Exception as exc:
            failed.append(exc)
            cancel.cancel()

    async with trio.open_nursery() as nursery:
        for i, name in enumerate(frontier):
            nursery.start_soon(one, i, name, nursery.cancel_scope)
    if failed:
        raise failed[0]
    return outputs


async def _run_node(run: GraphRun, name: str) -> Reply | ToolResult:
    node = run.app.nodes[name]
    if isinstance(node, ToolNode):
        return await _run_tool(run, node)
    prompt = agent_call_prompt(run.chat, run.app, node, run.state)
    simulated = None
    if node.simulate is not None and not run.caller.samples_tokens:
        try:
            simulated = node.simulate(run.state)
        except Exception as exc:
            raise NodeFailed(name, "simulate", exc) from exc
        if not isinstance(simulated, Simulated):
            raise TypeError(
                f"simulate of agent {name!r} returned {type(simulated).__name__}; "
                "expected a pbkv.Simulated"
            )
    step: int | None = None
    attempt = 0
    while True:
        try:
            reply = await run.caller.call(
                name,
                prompt.segments,
                max_new_tokens=node.max_new_tokens,
                sampling=node.sampling,
                simulated=simulated,
                context_tail=prompt.context_tail,
                step=step,
            )
        except CallFailed as exc:
            if attempt >= node.max_retries or not exc.retryable:
                raise
            log.warning("workflow %s: %s failed (%s); retrying", run.state.workflow_id, name, exc)
            step = exc.step
            attempt += 1
            continue
        except (TypeError, ValueError) as exc:  # the runtime refused the call's arguments
            raise NodeFailed(name, "call", exc) from exc
        run.replies.append(reply)
        run.path.append(name)
        return reply


async def _run_tool(run: GraphRun, node: ToolNode) -> ToolResult:
    if node.simulate is not None and not run.caller.samples_tokens:
        try:
            simulated = node.simulate(run.state)
        except Exception as exc:
            raise NodeFailed(node.name, "simulate", exc) from exc
        simulated = _tool_result(node.name, simulated)
        await run.caller.sleep(simulated.latency_s)
        return simulated
    started = now_s()
    try:
        text = node.run(run.state)  # an async def's coroutine, or a plain function's text
        if inspect.isawaitable(text):
            text = await text
    except Exception as exc:
        raise NodeFailed(node.name, "tool", exc) from exc
    if not isinstance(text, str):
        raise TypeError(f"tool {node.name!r} returned {type(text).__name__}; expected a str")
    return ToolResult(node.name, text, now_s() - started)


def _tool_result(name: str, simulated: Any) -> ToolResult:
    """Check a tool's simulated result: a :class:`ToolResult` or ``(text, latency_s)``."""
    if not isinstance(simulated, ToolResult):
        if not (
            isinstance(simulated, tuple)
            and len(simulated) == 2
            and isinstance(simulated[0], str)
            and isinstance(simulated[1], (int, float))
            and not isinstance(simulated[1], bool)
        ):
            raise TypeError(
                f"simulate of tool {name!r} returned {simulated!r}; expected "
                "(text, latency_s) or a ToolResult"
            )
        simulated = ToolResult(name, *simulated)
    if not (math.isfinite(simulated.latency_s) and simulated.latency_s >= 0):
        raise ValueError(
            f"simulate of tool {name!r} returned latency_s={simulated.latency_s!r}; "
            "expected a finite number of seconds >= 0"
        )
    return simulated


def _turn(run: GraphRun, name: str, out: Reply | ToolResult) -> Turn:
    if isinstance(out, Reply):
        return Turn(name, "agent", out.text, out.token_ids)
    ids = out.token_ids or encoded(run.chat, run.chat.render("tool", out.text))
    return Turn(name, "tool", out.text, ids)


def _successors(app: App, state: State, name: str, out: Reply | ToolResult) -> list[str]:
    edge = app.routers.get(name)
    if edge is None:
        return list(app.static_edges.get(name, ()))
    try:
        chosen = edge.route(state, out)
    except Exception as exc:
        raise NodeFailed(name, "router", exc) from exc
    if isinstance(chosen, str):
        targets = [chosen]
    elif isinstance(chosen, Sequence) and chosen and all(isinstance(t, str) for t in chosen):
        targets = list(chosen)
    else:
        raise TypeError(
            f"router of {name!r} returned {chosen!r}; expected a node name, END, or a "
            f"non-empty sequence of them (one of {edge.targets})"
        )
    for target in targets:
        if target not in edge.targets:
            raise ValueError(
                f"router of {name!r} returned {target!r}, not one of its targets {edge.targets}"
            )
    return targets
