"""A pbkv replica as a Dynamo worker: a full pbkv runtime behind ``LLMEngine`` (§7.6).

Needs the ``dynamo`` extra (``bash scripts/setup_dynamo.sh``). The worker is Dynamo's
own (``dynamo.common.backend.Worker``: registration, serving, cancellation, drain); the
engine it drives, :class:`PbkvEngine`, runs pbkv's runtime in trio *guest mode* on
Dynamo's asyncio loop, so every actor, the KV manager and the engine's scheduler run
exactly as under ``open_runtime``. Each request:

- names its workflow by Dynamo's session id (``X-Dynamo-Session-ID`` →
  ``agent_context.session_id``) and its agent by ``x-dynamo-meta-agent``
  (``context.metadata["agent"]``); a request without a session is a one-call workflow;
- ends its workflow after the reply when ``agent_context.session_final`` is set
  (``X-Dynamo-Session-Final: true``), retiring its cache (§4);
- streams its tokens back, the final chunk's usage carrying pbkv's cached tokens.

The radix tree's hooks feed a :class:`~pbkv.integrations.dynamo.events.KvEventRelay`
whose events go to Dynamo's ``KvEventPublisher``, so the KV router sees each replica's
cache as pbkv keeps it.

Run: ``python -m pbkv.integrations.dynamo.worker --model-path DIR --model-name NAME``
(Dynamo's environment variables choose discovery, request and event planes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from pbkv.actors.workload import Segment
from pbkv.integrations.dynamo.events import KvEventRelay, Removed, Stored
from pbkv.live.build import RuntimeConfig, open_runtime
from pbkv.live.session import Runtime, WorkflowSession

try:  # the dynamo extra
    from dynamo.common.backend.engine import EngineConfig, LLMEngine, LlmRegistration
    from dynamo.common.backend.publisher import PushSource
    from dynamo.common.backend.worker import WorkerConfig
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pbkv's Dynamo worker needs NVIDIA Dynamo 1.6.1: bash scripts/setup_dynamo.sh"
    ) from exc

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.2
"""How often a worker given ``--stats-path`` rewrites its counters."""

DEFAULT_AGENT = "agent"
"""The agent of a request that names none (``x-dynamo-meta-agent``)."""


@dataclass(frozen=True, slots=True)
class RequestHints:
    """What pbkv reads of one Dynamo request.

    Attributes:
        workflow_id: the session id, or ``None`` (a one-call workflow).
        agent: ``x-dynamo-meta-agent`` (``extra_args.pbkv.agent`` through pbkv's
            router service), else :data:`DEFAULT_AGENT`.
        final: ``session_final``: end the workflow after this reply.
        max_new_tokens: ``stop_conditions.max_tokens``.
    """

    workflow_id: str | None
    agent: str
    final: bool
    max_new_tokens: int


def request_hints(
    request: Mapping[str, Any], metadata: Mapping[str, str], default_max_tokens: int
) -> RequestHints:
    """Read the workflow, agent, final flag and decode budget of a Dynamo request.

    Args:
        request: the preprocessed request (``token_ids``, ``agent_context``, ...).
        metadata: ``context.metadata`` (``x-dynamo-meta-*`` headers, prefix dropped).
        default_max_tokens: the budget when the request sets none.
    """
    agent_context = request.get("agent_context")
    session = None
    final = False
    if isinstance(agent_context, Mapping):
        raw = agent_context.get("session_id")
        session = raw.strip() or None if isinstance(raw, str) else None
        final = bool(agent_context.get("session_final"))
    stop = request.get("stop_conditions") or {}
    budget = stop.get("max_tokens") or default_max_tokens
    extra = request.get("extra_args") or {}
    forwarded = extra.get("pbkv") if isinstance(extra, Mapping) else None  # pbkv's router
    agent = metadata.get("agent") or (forwarded or {}).get("agent") or DEFAULT_AGENT
    return RequestHints(session, agent, final or session is None, max(1, int(budget)))


class PbkvEngine(LLMEngine):
    """A pbkv runtime as a Dynamo ``LLMEngine``.

    Args:
        config: the runtime to build (engine, policy, tiers, block size).
        model_name: the served model's name.
        context_length: the longest prompt + output it accepts.
        default_max_tokens: decode budget of a request that sets none.
    """

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        model_name: str,
        context_length: int = 32_768,
        default_max_tokens: int = 64,
        stats_path: str | None = None,
    ) -> None:
        self.config = config
        self.model_name = model_name
        self.context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.stats_path = stats_path
        self.runtime: Runtime | None = None
        self.worker_id: int | None = None
        self.relay: KvEventRelay | None = None
        self._publisher: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._sessions: dict[str, WorkflowSession] = {}
        self._opening: trio.Lock | None = None
        self._serving: Counter[str] = Counter()  # workflow -> its calls in flight here
        self._done: asyncio.Future[None] | None = None

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[PbkvEngine, WorkerConfig]:
        args = build_parser().parse_args(argv)
        config = RuntimeConfig(
            engine=args.engine,
            policy=args.policy,
            gpu_kv_tokens=args.gpu_kv_tokens,
            host_kv_tokens=args.host_kv_tokens,
            block_size=args.block_size,
        )
        engine = cls(
            config,
            model_name=args.model_name,
            default_max_tokens=args.default_max_tokens,
            stats_path=args.stats_path,
        )
        worker = WorkerConfig(
            namespace=args.namespace,
            component=args.component,
            endpoint=args.endpoint,
            model_name=args.model_path,
            served_model_name=args.model_name,
            discovery_backend=os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
            request_plane=os.environ.get("DYN_REQUEST_PLANE", "tcp"),
            event_plane=os.environ.get("DYN_EVENT_PLANE", "nats"),
        )
        return engine, worker

    async def start(self, worker_id: int) -> EngineConfig:
        """Start pbkv's runtime in trio guest mode on this asyncio loop."""
        self.worker_id = worker_id
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._done = loop.create_future()

        def finished(outcome: Any) -> None:
            if not self._done.done():  # type: ignore[union-attr]
                self._done.set_result(None)  # type: ignore[union-attr]
            if not ready.done():
                ready.set_exception(RuntimeError(f"pbkv runtime stopped: {outcome}"))
            with contextlib.suppress(Exception):
                outcome.unwrap()

        trio.lowlevel.start_guest_run(
            self._serve,
            ready,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=finished,
            host_uses_signal_set_wakeup_fd=True,
        )
        await ready
        assert self.runtime is not None
        log.info("pbkv worker %s ready: %s", worker_id, self.config)
        return EngineConfig(
            model=self.model_name,
            served_model_name=self.model_name,
            llm=LlmRegistration(
                context_length=self.context_length,
                kv_cache_block_size=self.config.block_size,
                total_kv_blocks=self.runtime.kv.config.gpu_capacity_blocks,
                max_num_seqs=self.config.batch_size,
                max_num_batched_tokens=8192,
            ),
        )

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        async with open_runtime(self.config) as runtime, trio.open_nursery() as nursery:
            self.runtime = runtime
            self.relay = KvEventRelay(runtime.kv.tree, on_events=self._publish)
            self._token = trio.lowlevel.current_trio_token()
            self._nursery = nursery
            self._stop = trio.Event()
            self._opening = trio.Lock()
            if self.stats_path is not None:
                nursery.start_soon(self._stats_loop)
            ready.set_result(None)
            await self._stop.wait()
            for session in list(self._sessions.values()):
                await session.end("aborted")
            nursery.cancel_scope.cancel()

    async def kv_event_sources(self) -> list[PushSource]:
        return [PushSource(on_ready=self._attach_publisher, dp_rank=0)]

    def _attach_publisher(self, publisher: Any) -> None:
        self._publisher = publisher

    def _publish(self) -> None:
        """Send the relay's pending events to Dynamo (trio side, same thread)."""
        if self.relay is None:
            return
        for event in self.relay.drain():
            if self._publisher is None:
                continue
            if isinstance(event, Stored):
                self._publisher.publish_stored(
                    token_ids=list(event.token_ids),
                    num_block_tokens=[event.block_size] * len(event.block_ids),
                    block_hashes=list(event.block_ids),
                    parent_hash=event.parent_id,
                )
            elif isinstance(event, Removed):
                self._publisher.publish_removed(list(event.block_ids))

    async def generate(
        self, request: dict[str, Any], context: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Serve one request through pbkv's runtime and stream its tokens."""
        hints = request_hints(request, _metadata(context), self.default_max_tokens)
        token_ids = tuple(int(t) for t in request["token_ids"])
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = trio.CancelScope()
        assert self._token is not None and self._nursery is not None
        nursery = self._nursery
        self._token.run_sync_soon(
            lambda: nursery.start_soon(self._call, hints, token_ids, queue, cancel, context.id())
        )
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, dict):  # the final chunk
                    yield item
                    return
                yield {"token_ids": list(item), "index": 0}
        finally:
            self._token.run_sync_soon(cancel.cancel)

    async def _call(
        self,
        hints: RequestHints,
        token_ids: tuple[int, ...],
        queue: asyncio.Queue[Any],
        cancel: trio.CancelScope,
        request_id: str,
    ) -> None:
        assert self.runtime is not None and self.relay is not None
        reply = None
        session: WorkflowSession | None = None
        try:
            self.relay.learn(token_ids)
            with cancel:  # the client leaving cancels the call, not the bookkeeping below
                session = await self._session(hints, request_id)
                self._serving[session.workflow_id] += 1
                self._write_stats()
                async with session.stream(
                    hints.agent,
                    [Segment("context", token_ids)],
                    max_new_tokens=hints.max_new_tokens,
                ) as stream:
                    async for delta in stream:
                        queue.put_nowait(delta.token_ids)
                reply = stream.reply
        except Exception as exc:  # this call fails alone (CallFailed, Overloaded, a bad request)
            log.warning("request %s failed: %r", request_id, exc)
            queue.put_nowait(RuntimeError(f"pbkv: {type(exc).__name__}: {exc}"))
        with trio.CancelScope(shield=True):
            if session is not None:
                self._serving[session.workflow_id] -= 1
                if not self._serving[session.workflow_id]:
                    del self._serving[session.workflow_id]
            if reply is not None:
                self.relay.learn(token_ids + reply.token_ids)  # publishes output blocks
                self.relay.forget(token_ids + reply.token_ids)
            self.relay.forget(token_ids)
            if session is not None and hints.final:
                await self._end(session)
            if reply is not None:
                queue.put_nowait(_final_chunk(reply))
            self._write_stats()

    async def _session(self, hints: RequestHints, request_id: str) -> WorkflowSession:
        assert self.runtime is not None
        wf = hints.workflow_id or f"call-{request_id}"
        assert self._opening is not None
        async with self._opening:  # a workflow's first calls may arrive together
            session = self._sessions.get(wf)
            if session is None or session.ended:
                session = await self.runtime.open_workflow(wf, app="dynamo")
                self._sessions[wf] = session
        return session

    async def _end(self, session: WorkflowSession) -> None:
        self._sessions.pop(session.workflow_id, None)
        await session.end("end")

    def _write_stats(self) -> None:
        """Write the replica's counters where ``--stats-path`` says (tests read them)."""
        if self.stats_path is None or self.runtime is None:
            return
        s = self.runtime.statistics()
        tree = self.runtime.kv.tree
        record = {
            "worker_id": self.worker_id,
            "prompt_tokens": s.kv.prompt_tokens,
            "cached_gpu_tokens": s.kv.cached_gpu_tokens,
            "cached_host_tokens": s.kv.cached_host_tokens,
            "workflows_active": list(self.runtime.active_workflows()),
            "serving": sorted(self._serving),
            "agents_by_workflow": {w: list(a) for w, a in s.agents_by_workflow.items()},
            "ended": s.ended_by_reason,
            "cached_blocks": sum(n.num_blocks for n in tree.nodes()),
            "retired_blocks": sum(n.num_blocks for n in tree.nodes() if n.retired),
            "published_blocks": self.relay.published_blocks() if self.relay else 0,
        }
        partial = f"{self.stats_path}.tmp"
        with open(partial, "w") as f:
            json.dump(record, f)
        os.replace(partial, self.stats_path)

    async def _stats_loop(self) -> None:
        """Rewrite the counters every :data:`STATS_INTERVAL_S` (the KV manager retires a
        workflow's cache after its last reply has gone)."""
        while True:
            await trio.sleep(STATS_INTERVAL_S)
            self._write_stats()

    async def abort(self, context: Any) -> None:
        """Nothing to do: leaving ``generate`` cancels the request's trio task."""

    async def cleanup(self) -> None:
        """Stop pbkv's runtime (open workflows end ``aborted``) and wait for it."""
        if self._token is not None and self._stop is not None:
            stop = self._stop
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(stop.set)
        if self._done is not None:
            await self._done


def _metadata(context: Any) -> Mapping[str, str]:
    metadata = getattr(context, "metadata", None)
    if metadata is None:
        return {}
    try:
        return dict(metadata.items())
    except Exception:  # an older binding without a mapping view
        return {}


def _final_chunk(reply: Any) -> dict[str, Any]:
    return {
        "token_ids": [],
        "index": 0,
        "finish_reason": "stop" if reply.finish_reason == "stop" else "length",
        "completion_usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": len(reply.token_ids),
            "total_tokens": reply.prompt_tokens + len(reply.token_ids),
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
        },
    }


def build_parser() -> argparse.ArgumentParser:
    """Return the worker's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m pbkv.integrations.dynamo.worker",
        description="A pbkv replica as a Dynamo worker",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-path", required=True, help="HF-style model folder (tokenizer)")
    parser.add_argument("--model-name", required=True, help="the served model's name")
    parser.add_argument("--engine", default="sim", choices=("sim", "torch"))
    parser.add_argument("--policy", default="pbkv")
    parser.add_argument("--gpu-kv-tokens", type=int, default=None)
    parser.add_argument("--host-kv-tokens", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--default-max-tokens", type=int, default=64)
    parser.add_argument("--namespace", default="dynamo")
    parser.add_argument("--component", default="pbkv")
    parser.add_argument("--endpoint", default="generate")
    parser.add_argument("--stats-path", default=None, help="write the replica's counters here")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run one pbkv worker until Dynamo's worker stops it (SIGTERM / SIGINT)."""
    from dynamo.common.backend.run import run

    logging.basicConfig(level=logging.INFO)
    run(PbkvEngine, argv)


if __name__ == "__main__":
    main()
