"""Measure the torch engine on this machine and fit a sim hardware profile to it (§7.1).

The sim's cost model is a roofline: a step takes ``max(FLOPs / F, bytes / B)`` with the
weights read once per step and every KV token touched (``engines/sim/costmodel.py``).
Calibration measures what the engine's own steps cost here, then picks the rates that
reproduce them in the sim's own units:

- ``F`` (``peak_flops_per_s``, at ``compute_efficiency`` 1) from one prefill chunk alone:
  ``2 · P · tokens / seconds``, as the sim counts a prefill token's FLOPs;
- ``B`` (``memory_bandwidth_bytes_per_s``, at ``bandwidth_efficiency`` 1) from pure
  decode steps at several batch sizes and contexts: the single rate that best fits
  ``(P · b + tokens read · KV bytes per token) / B`` to each, in relative error, where
  ``b`` is the sim's dtype bytes (2) whatever the engine runs (fp32 on CPU): the sim
  counts bytes in its own dtype, so the rate is in those units;
- the host link from block copies between the two pools, in the same units.

Plain synchronous code apart from the engine runs it measures through.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
import trio

from pbkv.engines.base import GenerateRequest
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.profile import HardwareProfile, ModelProfile
from pbkv.engines.torchengine.engine import TorchEngine, TorchEngineConfig, make_kv_config
from pbkv.engines.torchengine.measure import reload_bytes_per_s
from pbkv.kvmanager import KVManager

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SIM_DTYPE_BYTES = 2
"""Bytes per element the sim's cost model counts (``CostModel``'s default, as the
runtime builds it)."""

DEFAULT_POINTS = ((1, 512), (2, 512), (4, 512), (4, 1024))
"""``(batch, context tokens)`` of the decode steps measured: the torch bench's range at
concurrency 4 (hover cut to CPU size: prompts of 200-600 tokens)."""


class DecodePoint(NamedTuple):
    """A pure decode step of ``batch`` sequences of ``context_tokens`` each: its seconds."""

    batch: int
    context_tokens: int
    step_s: float


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the engine's steps cost on this machine.

    Attributes:
        prefill_tokens: tokens of the prefill chunk measured.
        prefill_s: its median seconds (the forward alone, no decodes beside it).
        decode: pure decode steps measured (median seconds each).
        reload_bytes_per_s: host → device block copies, in the engine's bytes.
        engine_dtype_bytes: bytes per element the engine computes in.
        threads: torch's intra-op threads during the measurement.
    """

    prefill_tokens: int
    prefill_s: float
    decode: tuple[DecodePoint, ...]
    reload_bytes_per_s: float
    engine_dtype_bytes: int
    threads: int


def calibrate(
    model: PreTrainedModel,
    *,
    prefill_tokens: int = 512,
    points: Sequence[tuple[int, int]] = DEFAULT_POINTS,
    steps: int = 8,
    repeats: int = 3,
) -> Calibration:
    """Measure ``model`` on the torch engine: one prefill chunk of ``prefill_tokens``
    (``repeats`` fresh prompts), ``steps`` pure decode steps at each ``(batch, context)``
    of ``points``, and host → device copies.

    Raises:
        ValueError: a count below 1.
    """
    if min(prefill_tokens, steps, repeats, *(n for p in points for n in p)) < 1:
        raise ValueError("calibration counts must be >= 1")
    weight = next(model.parameters())
    rng = np.random.default_rng(0)
    _serve(model, _prompts(model, rng, 2, 32), 3)  # one-off kernel set-up, not measured
    prefills = [_prefill_s(model, rng, prefill_tokens) for _ in range(repeats)]
    decode = tuple(DecodePoint(b, k, _decode_step_s(model, rng, b, k, steps)) for b, k in points)
    return Calibration(
        prefill_tokens=prefill_tokens,
        prefill_s=statistics.median(prefills),
        decode=decode,
        reload_bytes_per_s=reload_bytes_per_s(model, 16),
        engine_dtype_bytes=weight.element_size(),
        threads=torch.get_num_threads(),
    )


def _serve(model: PreTrainedModel, prompts: list[tuple[int, ...]], new_tokens: int) -> TorchEngine:
    """Serve ``prompts`` at once on a fresh engine (every prompt prefilled in its first
    step, nothing cached) for ``new_tokens`` each; return the engine after."""
    block_size = 16
    blocks = len(prompts) * -(-(max(map(len, prompts)) + new_tokens) // block_size)
    kv_config = make_kv_config(
        model, block_size=block_size, gpu_capacity_blocks=blocks, host_capacity_blocks=0
    )
    config = TorchEngineConfig(
        max_batch_size=len(prompts),
        max_prefill_tokens=sum(map(len, prompts)),
        stop_token_ids=(),
    )
    engine = TorchEngine(KVManager(kv_config, trio.current_time), model, config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            async with trio.open_nursery() as callers:
                for i, prompt in enumerate(prompts):
                    request = GenerateRequest(f"c{i}", None, "probe", prompt, new_tokens)
                    callers.start_soon(engine.generate, request)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return engine


def _prompts(model: PreTrainedModel, rng: np.random.Generator, n: int, tokens: int):
    vocab = int(model.config.vocab_size)
    return [tuple(int(t) for t in rng.integers(0, vocab, tokens)) for _ in range(n)]


def _prefill_s(model: PreTrainedModel, rng: np.random.Generator, tokens: int) -> float:
    stats = _serve(model, _prompts(model, rng, 1, tokens), 1).statistics()
    return stats.prefill_s


def _decode_step_s(
    model: PreTrainedModel, rng: np.random.Generator, batch: int, context: int, steps: int
) -> float:
    stats = _serve(model, _prompts(model, rng, batch, context), steps + 1).statistics()
    return stats.decode_s / stats.decode_forwards


# -- the fit -------------------------------------------------------------------------------


def fit_profile(
    calibration: Calibration, model: ModelProfile, name: str, description: str
) -> HardwareProfile:
    """Return the hardware profile whose roofline reproduces ``calibration`` for ``model``
    (see the module docstring), with a source line for every number.

    Raises:
        ValueError: the measurements leave no room for a rate (a zero time).
    """
    cal = calibration
    if cal.prefill_s <= 0 or any(p.step_s <= 0 for p in cal.decode):
        raise ValueError("calibration times must be > 0")
    flops_per_s = 2.0 * model.num_params * cal.prefill_tokens / cal.prefill_s
    kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * SIM_DTYPE_BYTES
    weights = model.num_params * SIM_DTYPE_BYTES
    per_s = np.array(
        [(weights + p.batch * (p.context_tokens + 1) * kv_bytes) / p.step_s for p in cal.decode]
    )
    bandwidth = float((per_s**2).sum() / per_s.sum())  # min Σ (bytes/B − t)² / t²
    link = cal.reload_bytes_per_s * SIM_DTYPE_BYTES / cal.engine_dtype_bytes
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    when = datetime.date.today().isoformat()
    by = f"pbkv calibrate on {platform.node() or 'this machine'}, {when}, {cal.threads} threads"
    points = ", ".join(
        f"b{p.batch}/k{p.context_tokens}: {p.step_s * 1e3:.0f} ms" for p in cal.decode
    )
    sources = {
        "tp": "one CPU process",
        "memory_bytes_per_gpu": "physical memory (os.sysconf); the bench sizes tiers in tokens",
        "memory_bandwidth_bytes_per_s": (
            f"{by}: pure decode steps ({points}) fitted as (P*2 + KV tokens read * "
            f"{kv_bytes} B) / B, in the sim's 2-byte units (the engine runs "
            f"{cal.engine_dtype_bytes}-byte weights)"
        ),
        "peak_flops_per_s": (
            f"{by}: a {cal.prefill_tokens}-token prefill chunk alone in "
            f"{cal.prefill_s * 1e3:.0f} ms (median), at 2*P FLOPs a token"
        ),
        "host_link_bytes_per_s": (
            f"{by}: host -> device block copies, {cal.reload_bytes_per_s / 1e9:.2f} GB/s in "
            f"the engine's bytes, scaled to the sim's 2-byte units"
        ),
        "compute_efficiency": "calibrated: the measured rate is the peak",
        "bandwidth_efficiency": "calibrated: the measured rate is the peak",
        "reserve_bytes_per_gpu": "estimate: the process, the model's weights and activations",
    }
    return HardwareProfile(
        name=name,
        description=description,
        tp=1,
        memory_bytes_per_gpu=int(ram),
        memory_bandwidth_bytes_per_s=bandwidth,
        peak_flops_per_s=flops_per_s,
        host_link_bytes_per_s=link,
        compute_efficiency=1.0,
        bandwidth_efficiency=1.0,
        reserve_bytes_per_gpu=2 * 2**30,
        sources=sources,
    )


class Check(NamedTuple):
    """One measured figure beside the fitted profile's prediction of it."""

    what: str
    measured_s: float
    predicted_s: float


def check_profile(
    calibration: Calibration, hardware: HardwareProfile, model: ModelProfile
) -> list[Check]:
    """Return every measured step beside what the sim predicts for it with ``hardware``."""
    cost = CostModel(hardware, model, dtype_bytes=SIM_DTYPE_BYTES)
    cal = calibration
    checks = [
        Check(
            f"prefill {cal.prefill_tokens} tokens",
            cal.prefill_s,
            cost.prefill_s(cal.prefill_tokens),
        )
    ]
    for p in cal.decode:
        predicted = cost.decode_step_s(p.batch, p.batch * (p.context_tokens + 1))
        checks.append(Check(f"decode b={p.batch} k={p.context_tokens}", p.step_s, predicted))
    return checks


def profile_toml(hardware: HardwareProfile) -> str:
    """Return ``hardware`` as a profile file (``engines/sim/profiles/*.toml``)."""
    lines = [
        f"# Hardware profile: {hardware.description}.",
        "# Written by `pbkv calibrate`: every rate is measured on the torch engine (see",
        "# engines/torchengine/calibrate.py); re-run it to calibrate another machine.",
        "",
        'kind = "hardware"',
        f"description = {_quoted(hardware.description)}",
    ]
    for field in (
        "tp",
        "memory_bytes_per_gpu",
        "memory_bandwidth_bytes_per_s",
        "peak_flops_per_s",
        "host_link_bytes_per_s",
        "compute_efficiency",
        "bandwidth_efficiency",
        "reserve_bytes_per_gpu",
    ):
        value = getattr(hardware, field)
        text = f"{value:_}" if isinstance(value, int) else f"{value:.6g}"
        lines += ["", f"{field} = {text}", f"{field}_source = {_quoted(hardware.sources[field])}"]
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- the command ---------------------------------------------------------------------------


def run_command(
    model_name: str,
    out: str | None,
    console: object,
    *,
    profile_name: str | None = None,
    prefill_tokens: int = 512,
    steps: int = 8,
    repeats: int = 3,
    device: str | None = None,
) -> int:
    """``pbkv calibrate``: measure ``model_name`` on the torch engine, fit the profile,
    print each measured step beside the profile's prediction, write it to ``out``."""
    from pathlib import Path

    from rich.table import Table

    from pbkv.engines.sim.profile import load_model as load_model_profile
    from pbkv.engines.torchengine.model import load_model

    model = load_model(model_name, device=device)
    profile_model = load_model_profile(MODEL_PROFILES.get(model_name, model_name))
    calibration = calibrate(model, prefill_tokens=prefill_tokens, steps=steps, repeats=repeats)
    name = profile_name or (Path(out).stem if out else "calibrated")
    cpu = platform.processor() or platform.machine()
    description = f"this machine's CPU ({cpu}, {calibration.threads} threads), torch engine"
    hardware = fit_profile(calibration, profile_model, name, description)
    table = Table(title=f"{name} x {profile_model.name}: measured vs the fitted sim")
    for header in ("step", "measured ms", "sim ms", "sim / measured"):
        table.add_column(header, justify="right")
    for check in check_profile(calibration, hardware, profile_model):
        table.add_row(
            check.what,
            f"{check.measured_s * 1e3:.1f}",
            f"{check.predicted_s * 1e3:.1f}",
            f"{check.predicted_s / check.measured_s:.2f}",
        )
    console.print(table)  # type: ignore[attr-defined]
    if out:
        Path(out).write_text(profile_toml(hardware), encoding="utf-8")
        console.print(f"wrote {out}")  # type: ignore[attr-defined]
    else:
        console.print(profile_toml(hardware), markup=False)  # type: ignore[attr-defined]
    return 0


MODEL_PROFILES = {"smollm2": "smollm2-135m", "tiny": "smollm2-135m"}
"""The sim model profile of each torch model name (tiny stands in with SmolLM2's shapes
only for trying the command; its rates mean nothing)."""
