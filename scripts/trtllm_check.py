"""The TensorRT-LLM adapter on a real engine: lru vs pbkv steering; writes one JSON.

**Has not run anywhere yet**: no machine of this project can install TensorRT-LLM 1.2
(PyPI holds a placeholder; NVIDIA's wheel needs CUDA 13 and a GPU). Where ``import
tensorrt_llm`` fails the script says why and exits 2.

What it does where it can run (§7.3, issue 12):

1. builds ``tensorrt_llm.LLM(model, kv_cache_config=KvCacheConfig(enable_block_reuse=True,
   host_cache_size=..., event_buffer_max_size=..., tokens_per_block=32, max_tokens=...))``
   with a small GPU pool so offload happens;
2. checks the documented behaviour the steering relies on: a request with a retention
   config produces ``stored`` events carrying that priority (PR #8634 on the PyTorch
   backend), and a repeated prompt reports reused blocks in its perf metrics;
3. serves the same small ``codegen`` workload twice through the actor system on the
   real clock: TensorRT-LLM's default (no retention configs) and pbkv steering it;
   records latency, hit rates, touches and mirror statistics.

h_txt: TensorRT-LLM returns no hidden state by default, so results carry none and a
learned predictor reads the prompt tail through its own text encoder instead.

Usage: ``python scripts/trtllm_check.py --model /path/to/hf-model --out trtllm_check.json``
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import msgspec


def _build_llm(args):
    from tensorrt_llm import LLM
    from tensorrt_llm.llmapi import KvCacheConfig

    kv = KvCacheConfig(
        enable_block_reuse=True,
        max_tokens=args.gpu_kv_tokens,
        host_cache_size=args.host_cache_bytes,
        event_buffer_max_size=1 << 14,
        tokens_per_block=32,
    )
    return LLM(model=args.model, kv_cache_config=kv, return_perf_metrics=True)


async def _probe(engine, kv) -> dict:
    """A tagged request's ``stored`` priority, and reuse on a repeat (the API facts)."""
    import trio

    from pbkv.engines.base import GenerateRequest

    prompt = tuple(range(1000, 1000 + 200))
    kv.on_workflow_started("probe")
    req = GenerateRequest("probe/0", "probe", "a", prompt, 4, fixed_prefix_tokens=64)
    first = await engine.generate(req)
    second = await engine.generate(GenerateRequest("probe/1", "probe", "a", prompt, 4))
    await trio.sleep(1.0)
    prios = sorted({b.priority for b in kv.mirror.blocks.values()})
    return {
        "first_cached_tokens": first.cached_gpu_tokens + first.cached_host_tokens,
        "repeat_cached_tokens": second.cached_gpu_tokens + second.cached_host_tokens,
        "mirrored_priorities": prios,
        "retention_reaches_engine": 95 in prios,
    }


def _serve(llm, policy: str, args) -> dict:
    import trio

    from pbkv.actors.serve import serve_workflows
    from pbkv.bench.compare import BenchConfig, build_forecasters
    from pbkv.engines.trtllm import MirrorKV, TrtllmEngine, TrtllmEngineConfig, load_api
    from pbkv.engines.trtllm.real import ThreadedLLM, block_key_hasher
    from pbkv.examples import get_app

    app = get_app("codegen")
    workload = app.generate(args.workflows, args.seed)
    config = BenchConfig(app="codegen", workflows=args.workflows, block_size=32)
    forecasters = build_forecasters(
        config, app.agents, app.edges, workload, app.generate(300, args.seed + 10_000)
    )
    kv = MirrorKV(policy, tokens_per_block=32)
    engine = TrtllmEngine(
        ThreadedLLM(llm),
        kv,
        TrtllmEngineConfig(tokens_per_block=32),
        hasher=block_key_hasher,
        api=load_api(real=True),
    )
    out: dict = {}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            if policy == "pbkv":
                out["probe"] = await _probe(engine, kv)
            started = time.perf_counter()
            outcomes = await serve_workflows(
                workload,
                engine=engine,
                kv=kv,
                forecasters=forecasters if policy == "pbkv" else (),
                concurrency=args.concurrency,
            )
            out["wall_s"] = time.perf_counter() - started
            nursery.cancel_scope.cancel()
        results = [r for o in outcomes for r in o.results]
        prompt = sum(r.prompt_tokens for r in results)
        out["mean_latency_s"] = sum(o.latency_s for o in outcomes) / len(outcomes)
        out["gpu_hit_rate_estimate"] = sum(r.cached_gpu_tokens for r in results) / prompt
        out["total_hit_rate"] = sum(r.prompt_tokens - r.computed_tokens for r in results) / prompt
        out["adapter"] = msgspec.to_builtins(engine.statistics())

    trio.run(main)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="local Hugging Face model folder (offline)")
    parser.add_argument("--out", default="trtllm_check.json")
    parser.add_argument("--workflows", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-kv-tokens", type=int, default=16_384)
    parser.add_argument("--host-cache-bytes", type=int, default=4 << 30)
    args = parser.parse_args(argv)
    from pbkv.engines.trtllm.real import import_tensorrt_llm

    try:
        trtllm = import_tensorrt_llm()
    except ImportError as exc:
        print(f"trtllm_check cannot run here: {exc}", file=sys.stderr)
        return 2
    if not args.model:
        print("trtllm_check: --model is required", file=sys.stderr)
        return 2
    report: dict = {"tensorrt_llm": getattr(trtllm, "__version__", "?"), "model": args.model}
    failed = False
    llm = _build_llm(args)
    for policy in ("lru", "pbkv"):
        try:
            report[policy] = _serve(llm, policy, args)
        except Exception:  # keep the other run's numbers
            report[policy] = {"error": traceback.format_exc()}
            failed = True
    Path(args.out).write_bytes(msgspec.json.format(msgspec.json.encode(report)))
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
