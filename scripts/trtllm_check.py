"""The TensorRT-LLM adapter on a real engine: the API facts, then lru vs pbkv; one JSON.

**Has not run anywhere yet**: no machine of this project can install TensorRT-LLM 1.2
(it runs in NVIDIA's TensorRT-LLM container, see ``docs/trtllm.md``). Where ``import
tensorrt_llm`` fails the script says why and exits 2.

The report is rewritten after every section (:class:`pbkv.bench.checkrun.SectionReport`).
Sections, the first-run checklist of ``docs/trtllm.md``:

1. ``environment``: versions; whether the KV-event serializer survives an ``updated``
   event with a None field (``tensorrt_llm/_utils.py``, fixed upstream 2026-02; where
   not, each part runs its worker in-process and patches it, see ``real.py``);
2. ``retention_config``: ``KvCacheRetentionConfig`` builds without ``directory``;
3. ``probe`` (a fresh process, a small GPU pool): a tagged request's ``stored`` events
   carry its priority (PR #8634), trailing partial blocks arrive, the hashes pbkv's port
   computes are the engine's (plain and salted) and the binding's, a repeat reports
   ``cached_tokens``, offload and onboard arrive as separate ``updated`` events, and a
   demoted prefix (priority 10, no duration) is dropped rather than offloaded;
4. ``lru`` and 5. ``pbkv`` (each a fresh process and a fresh ``LLM``, so pbkv does not
   start on lru's warm cache): the ``codegen`` workload through the actor system on the
   real clock; the mirror is read once its events are quiet.

``max_num_tokens`` and ``max_seq_len`` come from the workload (its longest prompt; the
engine's default 8,192 is shorter than a codegen prompt).

Usage: ``python scripts/trtllm_check.py --model /path/to/hf-model --out trtllm_check.json
[--quick] [--tokenizer tokenizer.json]`` (``--part`` runs one part in this process).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

BLOCK = 32
PARTS = ("probe", "lru", "pbkv")


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def engine_limits(workload: Any, floor: int = 8192) -> dict[str, int]:
    """``LLM`` limits that fit ``workload``: every prompt in one prefill (no chunking),
    every sequence within ``max_seq_len``.

    Returns:
        ``max_num_tokens`` (at least ``floor``, upstream's default), ``max_seq_len``,
        and the workload's longest prompt and sequence.
    """
    prompt = max(s.prompt_tokens for w in workload for s in w.steps)
    total = max(s.prompt_tokens + s.output_tokens for w in workload for s in w.steps)
    return {
        "max_num_tokens": max(floor, round_up(prompt + 1, 1024)),
        "max_seq_len": round_up(total + 1, 1024),
        "longest_prompt_tokens": prompt,
        "longest_sequence_tokens": total,
    }


def build_llm(args: argparse.Namespace, limits: dict[str, int], gpu_kv_tokens: int) -> Any:
    """A ``tensorrt_llm.LLM`` with reuse, events, a host tier and perf metrics."""
    from tensorrt_llm import LLM
    from tensorrt_llm.llmapi import KvCacheConfig

    kv = KvCacheConfig(
        enable_block_reuse=True,
        max_tokens=gpu_kv_tokens,
        host_cache_size=args.host_cache_bytes,
        event_buffer_max_size=1 << 14,
        tokens_per_block=BLOCK,
        enable_partial_reuse=args.partial_reuse,
    )
    return LLM(
        model=args.model,
        kv_cache_config=kv,
        return_perf_metrics=True,
        max_num_tokens=limits["max_num_tokens"],
        max_seq_len=limits["max_seq_len"],
        max_batch_size=max(8, args.concurrency * 2),
    )


def guard_serializer() -> dict[str, Any]:
    """Run the worker in this process and patch its serializer if it lacks the None guard."""
    from pbkv.engines.trtllm.real import guard_event_serializer, serializer_handles_none

    handles = serializer_handles_none()
    if not handles:
        os.environ["TLLM_WORKER_USE_SINGLE_PROCESS"] = "1"
    return {"handles_none": handles, "patched": guard_event_serializer()}


def workload(args: argparse.Namespace):
    from pbkv.examples import get_app

    return get_app("codegen").generate(args.workflows, args.seed)


class EventLog:
    """Keeps the raw events a mirror applies (the probe reads them)."""

    def __init__(self, mirror: Any) -> None:
        self.events: list[dict[str, Any]] = []
        apply_all = mirror.apply_all

        def logged(events):
            events = list(events)
            self.events.extend(events)
            return apply_all(events)

        mirror.apply_all = logged

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e["data"] for e in self.events if e.get("data", {}).get("type") == kind]


async def probe(engine: Any, kv: Any, log: EventLog) -> dict[str, Any]:
    """The facts the steering relies on, read from one engine's events and outputs."""
    from pbkv.engines.base import GenerateRequest
    from pbkv.engines.trtllm import prompt_block_hashes
    from pbkv.engines.trtllm.real import block_key_hasher

    out: dict[str, Any] = {}
    prompt = tuple(range(1000, 1200))  # 199 usable tokens: 6 full blocks, then 7 partial
    hashes = prompt_block_hashes(prompt, BLOCK)
    kv.on_workflow_started("probe")
    first = await engine.generate(
        GenerateRequest("p0", "probe", "a", prompt, 4, fixed_prefix_tokens=64)
    )
    await engine.events_quiet()
    mirror = kv.mirror
    out["hashes_in_mirror"] = [h in mirror.blocks for h in hashes]
    out["port_matches_engine"] = all(out["hashes_in_mirror"])
    try:
        out["binding_matches_port"] = block_key_hasher(prompt, BLOCK) == hashes
    except Exception as exc:  # an internal binding: absent or renamed in some builds
        out["binding_matches_port"] = f"{type(exc).__name__}: {exc}"
    out["stored_priorities"] = [mirror.blocks[h].priority for h in hashes if h in mirror.blocks]
    out["retention_reaches_engine"] = out["stored_priorities"][:2] == [95, 95]
    sizes = [len(b["tokens"]) for d in log.of("stored") for b in d["blocks"]]
    out["stored_block_sizes"] = sizes
    out["partial_blocks_stored"] = sum(n < BLOCK for n in sizes)
    repeat = await engine.generate(GenerateRequest("p1", "probe", "a", prompt, 4))
    out["first_cached_tokens"] = first.cached_gpu_tokens + first.cached_host_tokens
    out["repeat_cached_tokens"] = repeat.cached_gpu_tokens + repeat.cached_host_tokens
    out["repeat_expected_tokens"] = len(prompt) - 1
    salted = await engine.generate(GenerateRequest("p2", "probe", "a", prompt, 4, namespace="t"))
    await engine.events_quiet()
    salted_hashes = prompt_block_hashes(prompt, BLOCK, "t")
    out["salted_cached_tokens"] = salted.cached_gpu_tokens + salted.cached_host_tokens
    out["salted_port_matches_engine"] = all(h in mirror.blocks for h in salted_hashes)
    out.update(await offload_and_demote(engine, kv, log, prompt, hashes))
    out["updated_event_shapes"] = sorted(
        {(d["cache_level"] is None, d["priority"] is None) for d in log.of("updated")}
    )
    out["event_samples"] = log.events[:12]
    out["mirror"] = msgspec.to_builtins(mirror.statistics())
    return out


async def offload_and_demote(engine, kv, log, prompt, hashes) -> dict[str, Any]:
    """Push the probe prompt to host and back; then demote it and push it out again."""
    from pbkv.engines.base import GenerateRequest

    def moved(hs, old, new):
        return sum(
            1
            for d in log.of("updated")
            if d["block_hash"] in hs
            and d["cache_level"] is not None
            and (d["cache_level"]["old_value"], d["cache_level"]["new_value"]) == (old, new)
        )

    async def flood(tag: str) -> None:
        for k in range(6):  # six other 1,000-token prompts: more than the small GPU pool
            base = 5000 + 1000 * k + (0 if tag == "a" else 20_000)
            await engine.generate(
                GenerateRequest(f"f{tag}{k}", None, "f", tuple(range(base, base + 1000)), 1)
            )
        await engine.events_quiet()

    hs = set(hashes)
    await flood("a")
    out = {"offloaded_blocks": moved(hs, 0, 1)}
    back = await engine.generate(GenerateRequest("p3", None, "a", prompt, 1))
    await engine.events_quiet()
    out["onboarded_blocks"] = moved(hs, 1, 0)
    out["onboarded_cached_tokens"] = back.cached_host_tokens + back.cached_gpu_tokens
    before = len(log.events)
    await engine.retag(prompt, 10)
    await flood("b")
    later = log.events[before:]
    out["demoted_blocks_dropped"] = sum(
        h in hs for e in later if e["data"]["type"] == "removed" for h in e["data"]["block_hashes"]
    )
    out["demoted_blocks_offloaded"] = sum(
        1
        for e in later
        if e["data"]["type"] == "updated"
        and e["data"]["block_hash"] in hs
        and (e["data"]["cache_level"] or {}).get("new_value") == 1
    )
    return out


def run_part(part: str, args: argparse.Namespace) -> dict[str, Any]:
    """One part in this process: a fresh ``LLM``, the adapter over it, and the part."""
    import trio

    from pbkv.engines.trtllm import MirrorKV, TrtllmEngine, TrtllmEngineConfig
    from pbkv.engines.trtllm.real import ThreadedLLM

    work = workload(args)
    limits = engine_limits(work)
    result: dict[str, Any] = {"limits": limits, "serializer": guard_serializer()}
    gpu_kv_tokens = args.probe_gpu_kv_tokens if part == "probe" else args.gpu_kv_tokens
    started = time.perf_counter()
    llm = build_llm(args, limits, gpu_kv_tokens)
    result["build_s"] = time.perf_counter() - started
    kv = MirrorKV("lru" if part == "lru" else "pbkv", tokens_per_block=BLOCK)
    config = TrtllmEngineConfig(tokens_per_block=BLOCK, partial_reuse=args.partial_reuse)
    engine = TrtllmEngine(ThreadedLLM(llm), kv, config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            if part == "probe":
                result.update(await probe(engine, kv, EventLog(kv.mirror)))
            else:
                result.update(await serve(engine, kv, work, part, args))
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        llm.shutdown()
    result["adapter"] = msgspec.to_builtins(engine.statistics())
    return result


async def serve(engine: Any, kv: Any, work: Any, policy: str, args) -> dict[str, Any]:
    from pbkv.actors.serve import serve_workflows
    from pbkv.bench.compare import BenchConfig, build_forecasters
    from pbkv.examples import get_app

    app = get_app("codegen")
    config = BenchConfig(app="codegen", workflows=args.workflows, block_size=BLOCK)
    forecasters = (
        build_forecasters(
            config, app.agents, app.edges, work, app.generate(300, args.seed + 10_000)
        )
        if policy == "pbkv"
        else ()
    )
    started = time.perf_counter()
    outcomes = await serve_workflows(
        work, engine=engine, kv=kv, forecasters=forecasters, concurrency=args.concurrency
    )
    wall_s = time.perf_counter() - started
    await engine.events_quiet()  # the mirror has every event the run caused
    results = [r for o in outcomes for r in o.results]
    prompt = sum(r.prompt_tokens for r in results)
    return {
        "wall_s": wall_s,
        "workflows": len(outcomes),
        "errors": [o.error for o in outcomes if o.error][:5],
        "reasons": sorted({str(o.reason) for o in outcomes}),
        "mean_latency_s": sum(o.latency_s for o in outcomes) / len(outcomes),
        "gpu_hit_rate_estimate": sum(r.cached_gpu_tokens for r in results) / prompt,
        "total_hit_rate": sum(r.prompt_tokens - r.computed_tokens for r in results) / prompt,
    }


def environment() -> dict[str, Any]:
    import platform

    import tensorrt_llm

    from pbkv.engines.trtllm.real import serializer_handles_none

    out = {
        "tensorrt_llm": getattr(tensorrt_llm, "__version__", "?"),
        "python": platform.python_version(),
    }
    try:
        import torch

        out["torch"] = torch.__version__
        out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        out["torch"] = None
    out["serializer_handles_none"] = serializer_handles_none()
    return out


def retention_config_builds() -> str:
    from tensorrt_llm.llmapi import KvCacheRetentionConfig

    rng = KvCacheRetentionConfig.TokenRangeRetentionConfig(0, None, 95)
    return repr(KvCacheRetentionConfig([rng], 35))


def child(part: str, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Run one part in a fresh process; return its result (or its error)."""
    part_out = args.out.with_name(f"{args.out.stem}.{part}.json")
    part_out.unlink(missing_ok=True)
    command = [sys.executable, __file__, *argv, "--part", part, "--out", str(part_out)]
    done = subprocess.run(command, timeout=args.part_timeout_s, check=False)
    if not part_out.is_file():
        raise RuntimeError(f"part {part} wrote nothing (exit status {done.returncode})")
    result = msgspec.json.decode(part_out.read_bytes()).get(part)
    if not isinstance(result, dict) or "error" in result:
        raise RuntimeError(f"part {part}: {result!r}"[:2000])
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="local Hugging Face model folder (offline)")
    parser.add_argument("--out", type=Path, default=Path("trtllm_check.json"))
    parser.add_argument("--quick", action="store_true", help="4 workflows, concurrency 4")
    parser.add_argument("--workflows", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-kv-tokens", type=int, default=65_536)
    parser.add_argument("--probe-gpu-kv-tokens", type=int, default=4096)
    parser.add_argument("--host-cache-bytes", type=int, default=4 << 30)
    parser.add_argument(
        "--partial-reuse",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="KvCacheConfig.enable_partial_reuse (off: Dynamo KVBM's advice; the adapter "
        "handles both)",
    )
    parser.add_argument("--tokenizer", type=Path, help="SmolLM2's tokenizer.json (no wheel)")
    parser.add_argument("--part", choices=PARTS, help="run one part in this process")
    parser.add_argument("--part-timeout-s", type=float, default=1800)
    args = parser.parse_args(argv)
    if args.quick:
        args.workflows, args.concurrency = 4, 4
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    from pbkv.bench.checkrun import SectionReport, use_tokenizer_file
    from pbkv.engines.trtllm.real import import_tensorrt_llm

    try:
        import_tensorrt_llm()
    except ImportError as exc:
        print(f"trtllm_check cannot run here: {exc}", file=sys.stderr)
        return 2
    if not args.model:
        print("trtllm_check: --model is required", file=sys.stderr)
        return 2
    if args.tokenizer is not None:
        use_tokenizer_file(args.tokenizer)
    report = SectionReport(args.out, {"model": args.model, "quick": args.quick})
    if args.part is not None:
        report.run(args.part, lambda: run_part(args.part, args))
        return 0 if report.ok else 1
    report.run("environment", environment)
    report.run("retention_config", retention_config_builds)
    report.run("limits", lambda: engine_limits(workload(args)))
    parent_argv = _without_option(argv, "--out")
    for part in PARTS:
        report.run(part, lambda part=part: child(part, args, parent_argv))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if report.ok else 1


def _without_option(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(f"{name}="):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
