"""pbkv's placement as a Dynamo router service (§7.6): every request of a workflow
goes where :class:`~pbkv.integrations.dynamo.placement.PbkvPlacement` puts it.

Needs the ``dynamo`` extra. The service registers the public model (token input) on
``{namespace}.pbkv_router.generate``; the pbkv workers register under
``{model}-replicas`` on ``{namespace}.pbkv.generate``. For each request it reads Dynamo's
KV router's view of every worker (``get_overlap_scores``: device and host-pinned
blocks from the workers' KV events; ``get_potential_loads``: decode blocks in flight),
asks the placement, and forwards the request pinned to the chosen worker
(``routing.backend_instance_id``), as upstream's ``thunderagent_router`` pins programs.
The agent (``x-dynamo-meta-agent``) travels on to the worker in ``extra_args.pbkv``.

Run: ``python -m pbkv.integrations.dynamo.router --model-path DIR --model-name NAME``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pbkv.integrations.dynamo.placement import (
    Placement,
    PlacementRequest,
    ReplicaView,
    blocks_of,
    make_placement,
)

try:  # the dynamo extra
    import uvloop
    from dynamo.llm import (
        KvRouter,
        KvRouterConfig,
        ModelInput,
        ModelType,
        WorkerType,
        register_model,
    )
    from dynamo.runtime import DistributedRuntime
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pbkv's Dynamo router needs NVIDIA Dynamo 1.6.1: bash scripts/setup_dynamo.sh"
    ) from exc

log = logging.getLogger(__name__)

APP = "dynamo"
"""The app name the placement's forecast learns under."""


def replica_views(overlap: Mapping[str, Any], loads: list[Mapping[str, Any]]) -> list[ReplicaView]:
    """Return one view per worker from ``get_overlap_scores`` and ``get_potential_loads``.

    Workers of several data-parallel ranks are summed per worker id. A worker with no
    overlap row has none cached.
    """
    cached: dict[int, tuple[int, int]] = {}
    rows = overlap.get("workers", [])
    for row in rows.values() if isinstance(rows, Mapping) else rows:
        worker = int(row["worker_id"])
        gpu, host = cached.get(worker, (0, 0))
        cached[worker] = (
            gpu + int(row.get("device_blocks", 0)),
            host + int(row.get("host_pinned_blocks", 0)),
        )
    active: dict[int, int] = {}
    for row in loads:
        worker = int(row["worker_id"])
        active[worker] = active.get(worker, 0) + int(row.get("potential_decode_blocks", 0))
    return [
        ReplicaView(w, *cached.get(w, (0, 0)), active[w]) for w in sorted(active | dict(cached))
    ]


class PlacementRouter:
    """The service's request handler.

    Args:
        kv_router: Dynamo's ``KvRouter`` over the pbkv workers' endpoint.
        placement: the placement policy.
        block_size: the workers' KV block size.
    """

    def __init__(self, kv_router: Any, placement: Placement, block_size: int) -> None:
        self.kv_router = kv_router
        self.placement = placement
        self.block_size = block_size

    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[Any]:
        """Place ``request`` and stream the chosen worker's reply."""
        token_ids = list(request["token_ids"])
        agent_context = request.get("agent_context") or {}
        workflow = agent_context.get("session_id") or None
        metadata = getattr(context, "metadata", None)
        agent = (metadata.get("agent") if metadata is not None else None) or "agent"
        stop = request.get("stop_conditions") or {}
        wanted = PlacementRequest(
            workflow or f"call-{id(request)}",
            agent,
            blocks_of(len(token_ids), self.block_size),
            blocks_of(int(stop.get("max_tokens") or 0), self.block_size),
            APP,
        )
        views = replica_views(
            await self.kv_router.get_overlap_scores(token_ids),
            await self.kv_router.get_potential_loads(token_ids),
        )
        if not views:
            raise RuntimeError("no pbkv worker is registered")
        decision = self.placement.place(wanted, views)
        forwarded = _forwarded(request, decision.replica, agent)
        output_tokens = 0
        try:
            async for chunk in await self.kv_router.generate_from_request(forwarded):
                data = chunk.get("data", chunk) if isinstance(chunk, Mapping) else chunk
                if isinstance(data, Mapping):
                    output_tokens += len(data.get("token_ids") or ())
                yield chunk
        finally:
            blocks = blocks_of(len(token_ids) + output_tokens, self.block_size)
            self.placement.done(wanted, decision.replica, blocks)
            if workflow is None or agent_context.get("session_final"):
                self.placement.finish(wanted.workflow_id)


def _forwarded(request: Mapping[str, Any], worker_id: int, agent: str) -> dict[str, Any]:
    """Return ``request`` as the KV router forwards it, pinned to ``worker_id``."""
    routing = dict(request.get("routing") or {})
    routing.update(backend_instance_id=worker_id, dp_rank=0)
    extra = dict(request.get("extra_args") or {})
    extra["pbkv"] = {"agent": agent}
    keys = (
        "model", "token_ids", "stop_conditions", "sampling_options", "output_options",
        "eos_token_ids", "annotations", "router_config_override", "agent_context",
        "request_timestamp_ms",
    )  # fmt: skip
    out = {k: request[k] for k in keys if request.get(k) is not None}
    out.update(routing=routing, extra_args=extra)
    return out


def build_parser() -> argparse.ArgumentParser:
    """Return the service's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m pbkv.integrations.dynamo.router",
        description="pbkv's workflow placement in front of pbkv Dynamo workers",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--model-name", required=True, help="the public model's name")
    parser.add_argument("--placement", default="pbkv")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--namespace", default="dynamo")
    parser.add_argument(
        "--workers", default="pbkv.generate", help="the workers' component.endpoint"
    )
    return parser


async def serve(args: argparse.Namespace) -> None:
    """Register the public model and serve it until the process is stopped."""
    import asyncio

    runtime = DistributedRuntime(
        asyncio.get_running_loop(),
        os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
        os.environ.get("DYN_REQUEST_PLANE", "tcp"),
    )
    workers = runtime.endpoint(f"{args.namespace}.{args.workers}")
    kv_router = KvRouter(
        endpoint=workers, block_size=args.block_size, kv_router_config=KvRouterConfig()
    )
    handler = PlacementRouter(kv_router, make_placement(args.placement), args.block_size)
    endpoint = runtime.endpoint(f"{args.namespace}.pbkv_router.generate")
    await register_model(
        model_input=ModelInput.Tokens,
        model_type=ModelType.Chat | ModelType.Completions,
        endpoint=endpoint,
        model_path=args.model_path,
        model_name=args.model_name,
        worker_type=WorkerType.Aggregated,
    )
    await endpoint.serve_endpoint(handler.generate, graceful_shutdown=True)


def main(argv: list[str] | None = None) -> None:
    """Run the placement service."""
    logging.basicConfig(level=logging.INFO)
    uvloop.run(serve(build_parser().parse_args(argv)))


if __name__ == "__main__":
    main()
