"""One short run of the torch engine on a CUDA machine; writes one JSON report.

Measures (§7.2, issue 5):

1. SmolLM2-135M (bf16): uncached prefill tokens/s, host → device block reload bytes/s
   (pinned host pool, side stream) and the time-to-first-token of a miss, a GPU hit and
   a host hit.
2. The same at a larger model shape (a Llama-3.2-1B-like config with random weights:
   16 layers, 8 KV heads, hidden 2048; timings do not depend on the weights).
3. lru vs pbkv through the actor system on the real clock at that shape: ``codegen``
   and ``taubench`` workloads replayed, much less cut down than on a CPU.
4. ``pbkv demo`` itself on the GPU: the live-codegen app on SmolLM2, routing on what
   the model writes and on real test runs, lru vs pbkv (also written on its own as
   ``demo.json`` beside the report, as ``pbkv demo --json`` writes it).

Each section that fails is recorded in the JSON with its error (and the exit status is
1), so one missing input (e.g. the τ-bench data) does not lose the other numbers.

Usage: ``python scripts/gpu_check.py --out gpu_check.json [--device cuda] [--quick]``
(``--quick``: tiny shapes, for a dry run of the script on a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import msgspec
import torch
import transformers

from pbkv.bench.replay_demo import DemoConfig, WorkloadShrink, run_demo
from pbkv.engines.torchengine import (
    hit_saving,
    load_model,
    prefill_tokens_per_s,
    reload_bytes_per_s,
    tiny_config,
)

LARGE_SHAPE = {  # Llama-3.2-1B's shape with SmolLM2's vocabulary (the apps' token ids)
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "initializer_range": 0.02,
}
QUICK_SHAPE = {"num_hidden_layers": 2}
BLOCK_SIZE = 16


def large_model(device: torch.device, quick: bool) -> torch.nn.Module:
    """Build the larger shape with random weights directly on ``device``."""
    from transformers import LlamaForCausalLM

    config = tiny_config(**(QUICK_SHAPE if quick else LARGE_SHAPE))
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(config)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return model.to(dtype=dtype).eval().requires_grad_(False)


def costs(model: torch.nn.Module, quick: bool) -> dict[str, object]:
    """Prefill rate, reload rate and what a hit saves, for one model."""
    lengths = (128,) if quick else (512, 2048)
    hit = hit_saving(model, prompt_tokens=lengths[-1], block_size=BLOCK_SIZE, repeats=3)
    params = sum(p.numel() for p in model.parameters())
    return {
        "parameters": params,
        "dtype": str(next(model.parameters()).dtype),
        "prefill_tokens_per_s": {str(n): prefill_tokens_per_s(model, n) for n in lengths},
        "reload_bytes_per_s": reload_bytes_per_s(model, BLOCK_SIZE, 64 if quick else 1024),
        "hit": {
            **dataclasses.asdict(hit),
            "gpu_hit_saves_s_per_1k_tokens": hit.gpu_hit_saves_s_per_1k_tokens,
            "host_hit_saves_s_per_1k_tokens": hit.host_hit_saves_s_per_1k_tokens,
        },
    }


def comparison(model: torch.nn.Module, quick: bool) -> list[dict[str, object]]:
    """lru vs pbkv on codegen and taubench, wall-clock, at the model's shape."""
    if quick:
        config = DemoConfig(workflows=2, concurrency=2, shrink=WorkloadShrink(max_steps=3))
    else:
        shrink = WorkloadShrink(
            preamble_tokens=4096,
            role_tokens=1024,
            head_tokens=512,
            tail_tokens=16,
            output_tokens=32,
            max_steps=12,
            gap_scale=0.25,
        )
        config = DemoConfig(
            workflows=16, concurrency=8, gpu_fraction=0.5, host_ratio=2.0, shrink=shrink
        )
    rows = []
    for app in config.apps:
        try:
            (result,) = run_demo(dataclasses.replace(config, apps=(app,)), model=model)
        except Exception as exc:  # recorded in the report; the exit status says it failed
            rows.append({"app": app, "error": _error(exc)})
            continue
        rows.append(
            {
                "app": app,
                "config": config,
                "workflows": result.workflows,
                "invocations": result.invocations,
                "gpu_kv_tokens": result.gpu_kv_tokens,
                "host_kv_tokens": result.host_kv_tokens,
                "results": [
                    {
                        f.name: getattr(r, f.name)
                        for f in dataclasses.fields(r)
                        if f.name != "hit_timeline"
                    }
                    for r in result.results
                ],
                "engines": list(result.engines),
            }
        )
    return rows


def live_demo(device: torch.device, quick: bool, out: Path) -> object:
    """``pbkv demo`` on ``device``; its JSON is also written to ``out``."""
    from pbkv.demo import DemoConfig as LiveDemoConfig
    from pbkv.demo import demo_record
    from pbkv.demo import run_demo as run_live_demo

    if quick:
        config = LiveDemoConfig(model="tiny", workflows=2, concurrency=2, device=str(device))
    else:
        config = LiveDemoConfig(workflows=8, concurrency=8, device=str(device))
    record = demo_record(run_live_demo(config), f"pbkv demo (scripts/gpu_check.py, {config})")
    out.write_bytes(record)
    return msgspec.json.decode(record)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def _error(exc: BaseException) -> str:
    traceback.print_exception(exc, file=sys.stderr)
    return f"{type(exc).__name__}: {exc}"


def _section(report: dict[str, object], name: str, run: Callable[[], object]) -> bool:
    started = time.perf_counter()
    try:
        report[name] = run()
        ok = True
    except Exception as exc:  # recorded in the report; the exit status says it failed
        report[name] = {"error": _error(exc)}
        ok = False
    print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a dry run on a CPU")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible; use --device cpu --quick for a dry run", file=sys.stderr)
        return 2
    report: dict[str, object] = {
        "device": _device_name(device),
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
        "block_size": BLOCK_SIZE,
    }
    ok = _section(
        report, "smollm2", lambda: costs(load_model("smollm2", device=device), args.quick)
    )
    large = large_model(device, args.quick)
    report["large_shape"] = QUICK_SHAPE if args.quick else LARGE_SHAPE
    ok &= _section(report, "large", lambda: costs(large, args.quick))
    ok &= _section(report, "comparison", lambda: comparison(large, args.quick))
    if isinstance(report["comparison"], list):
        ok &= all("error" not in row for row in report["comparison"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    demo_out = args.out.with_name("demo.json")
    ok &= _section(report, "live_demo", lambda: live_demo(device, args.quick, demo_out))
    args.out.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
