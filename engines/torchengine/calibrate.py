"""Measure the torch engine on this machine and fit a sim hardware profile to it (§7.1).

The sim's cost model is a roofline refined by three figures of the hardware profile
(``engines/sim/costmodel.py``): a step takes ``max(c, m) + (1 − overlap) · min(c, m) +
step_overhead_s + sequences · sequence_overhead_s``, where ``c`` is its FLOPs over ``F``
and ``m`` its bytes over ``B`` (the weights read once per step, every KV token touched).
Calibration times the engine's own packed forward and LM head
(:class:`~pbkv.engines.torchengine.forward.PagedForward`, as its worker runs a step) on
this machine, then picks the figures that reproduce those times in the sim's own units:

- prefill chunks alone of several sizes (``F``: a token's compute, ``2 · P`` FLOPs);
- pure decode steps at several batch sizes and contexts (``B``, in the sim's 2-byte units
  whatever the engine runs, fp32 on CPU; and what each sequence adds);
- decode steps that also carry a prefill chunk: how much of a chunk's compute a decode
  step hides, ``overlap`` (1 on a GPU, whose decode leaves compute idle; about 0 on a
  CPU, which runs a token's compute whatever runs beside it).

For each ``overlap`` from 0 to 1 in steps of 0.05, the other four figures are the
non-negative least squares fit in relative error (the overheads may be 0); the
``overlap`` that fits best is kept. The host link comes from block copies between the
two pools, in the same units.

Plain synchronous code apart from the forwards it times.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.profile import HardwareProfile, ModelProfile
from pbkv.engines.torchengine.forward import PagedForward, Segment
from pbkv.engines.torchengine.measure import reload_bytes_per_s
from pbkv.engines.torchengine.model import KVLayout
from pbkv.engines.torchengine.pool import PagedKVPools

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SIM_DTYPE_BYTES = 2
"""Bytes per element the sim's cost model counts (``CostModel``'s default, as the
runtime builds it)."""

DEFAULT_POINTS = ((1, 512), (2, 512), (4, 512), (8, 512), (4, 1024))
"""``(batch, context tokens)`` of the pure decode steps measured: the torch bench's range
at concurrency 4 (hover cut to CPU size: prompts of 200-600 tokens), and a batch of 8."""

CHUNK_FRACTIONS = (16, 4, 1)
"""Prefill chunks measured: ``prefill_tokens`` over each (512: 32, 128 and 512 tokens)."""

MIXED_FRACTIONS = (16, 4)
"""Chunks measured beside a decode batch: ``prefill_tokens`` over each."""

OVERLAPS = tuple(i / 20 for i in range(21))
"""The ``overlap`` values the fit tries."""

BLOCK_SIZE = 16
"""Tokens per pool block in the measurement."""


class StepPoint(NamedTuple):
    """One measured forward: prefill ``chunks`` (new tokens, cached tokens) beside
    ``batch`` decoding sequences of ``context_tokens`` each; its median seconds."""

    chunks: tuple[tuple[int, int], ...]
    batch: int
    context_tokens: int
    step_s: float

    @property
    def what(self) -> str:
        """Name the step: ``prefill 512``, ``decode b=4 k=512``, or both with ``+``."""
        parts = [f"decode b={self.batch} k={self.context_tokens}"] if self.batch else []
        parts += [f"prefill {n}" + (f" over {m}" if m else "") for n, m in self.chunks]
        return " + ".join(parts)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the engine's forwards cost on this machine.

    Attributes:
        points: every forward measured (median seconds each).
        reload_bytes_per_s: host → device block copies, in the engine's bytes.
        engine_dtype_bytes: bytes per element the engine computes in.
        threads: torch's intra-op threads during the measurement.
        device: where the forwards ran (``cpu``, ``cuda:0``...).
        device_memory_bytes: that device's memory: a GPU's total, a CPU's physical
            memory (``os.sysconf``).
    """

    points: tuple[StepPoint, ...]
    reload_bytes_per_s: float
    engine_dtype_bytes: int
    threads: int
    device: str = "cpu"
    device_memory_bytes: int = 0


def calibrate(
    model: PreTrainedModel,
    *,
    prefill_tokens: int = 512,
    points: Sequence[tuple[int, int]] = DEFAULT_POINTS,
    steps: int = 8,
    repeats: int = 3,
) -> Calibration:
    """Measure ``model``'s packed forward and LM head: prefill chunks alone
    (``prefill_tokens`` and fractions of it, :data:`CHUNK_FRACTIONS`), pure decode steps
    at each ``(batch, context)`` of ``points``, the smaller chunks beside the decode batch
    nearest ``(4, 512)`` (:data:`MIXED_FRACTIONS`), and host → device copies.

    The forwards are timed in rounds, each timing every point once (the chunks alone in
    the first ``repeats`` rounds, the rest in all ``steps``), so a change in the
    machine's load falls on every point alike; each point keeps its median.

    Raises:
        ValueError: a count below 1, or no decode point.
    """
    if not points or min(prefill_tokens, steps, repeats, *(n for p in points for n in p)) < 1:
        raise ValueError("calibration counts must be >= 1, with at least one decode point")
    weight = next(model.parameters())
    chunks = sorted({max(1, prefill_tokens // f) for f in CHUNK_FRACTIONS})
    beside = min(points, key=lambda p: (abs(p[0] - 4), abs(p[1] - 512)))
    mixed = sorted({max(1, prefill_tokens // f) for f in MIXED_FRACTIONS})
    batch = max(p[0] for p in points) + 1
    context = max(max(p[1] for p in points), prefill_tokens) + 1
    bench = _Forwards(model, batch, context)
    bench.time(((32, 0),), 0, 0)  # one-off kernel set-up, not measured
    plan = [(((n, 0),), 0, 0, repeats) for n in chunks]
    plan += [((), b, k, steps) for b, k in points]
    plan += [(((n, 0),), *beside, steps) for n in mixed]
    times: list[list[float]] = [[] for _ in plan]
    for round_ in range(max(steps, repeats)):
        for (step_chunks, b, k, runs), seen in zip(plan, times, strict=True):
            if round_ < runs:
                seen.append(bench.time(step_chunks, b, k))
    measured = [
        StepPoint(step_chunks, b, k, statistics.median(seen))
        for (step_chunks, b, k, _), seen in zip(plan, times, strict=True)
    ]
    return Calibration(
        points=tuple(measured),
        reload_bytes_per_s=reload_bytes_per_s(model, BLOCK_SIZE),
        engine_dtype_bytes=weight.element_size(),
        threads=torch.get_num_threads(),
        device=str(weight.device),
        device_memory_bytes=device_memory_bytes(weight.device),
    )


def device_memory_bytes(device: torch.device) -> int:
    """Return ``device``'s memory in bytes: a CUDA device's total, else this machine's
    physical memory."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class _Forwards:
    """Times packed forwards of ``model`` over a pool that holds ``sequences`` sequences
    of ``tokens`` tokens each."""

    def __init__(self, model: PreTrainedModel, sequences: int, tokens: int) -> None:
        weight = next(model.parameters())
        layout = KVLayout.of(model.config, BLOCK_SIZE, weight.dtype)
        self._per_seq = -(-tokens // BLOCK_SIZE)
        self._pools = PagedKVPools(layout, sequences * self._per_seq, 0, weight.device)
        self._forward = PagedForward(model, self._pools)
        self._head = model.get_output_embeddings()
        self._vocab = int(model.config.vocab_size)
        self._device = weight.device
        self._rng = np.random.default_rng(0)

    def time(self, chunks: tuple[tuple[int, int], ...], batch: int, context: int) -> float:
        """Return the seconds of one forward of ``batch`` decodes over ``context`` tokens
        each beside prefill ``chunks`` (new, cached tokens), the LM head's picks read."""
        segments = [self._decode(i, context) for i in range(batch)]
        segments += [self._chunk(batch + i, n, m) for i, (n, m) in enumerate(chunks)]
        with torch.inference_mode():
            if self._device.type == "cuda":
                torch.cuda.synchronize(self._device)
            started = time.perf_counter()
            hidden = self._forward(segments)
            self._head(hidden).argmax(-1).tolist()  # as the engine's worker reads picks
            return time.perf_counter() - started

    def _blocks(self, sequence: int) -> list[int]:
        return list(range(sequence * self._per_seq, (sequence + 1) * self._per_seq))

    def _decode(self, sequence: int, context: int) -> Segment:
        token = (int(self._rng.integers(self._vocab)),)
        return Segment(token, context, self._blocks(sequence), context)

    def _chunk(self, sequence: int, new: int, cached: int) -> Segment:
        ids = tuple(int(t) for t in self._rng.integers(0, self._vocab, new))
        return Segment(ids, cached, self._blocks(sequence), cached)


# -- the fit -------------------------------------------------------------------------------


class _Rates(NamedTuple):
    step_overhead_s: float
    sequence_overhead_s: float
    flops_per_s: float
    bytes_per_s: float


def _work(point: StepPoint, cost: CostModel) -> tuple[float, float, int]:
    """Return a point's FLOPs, bytes (the sim's units) and sequences, as ``cost`` counts
    them."""
    step = cost.step_cost(list(point.chunks), point.batch, point.batch * (point.context_tokens + 1))
    return step.flops, step.bytes_per_gpu, len(point.chunks) + point.batch


def _unit_cost(model: ModelProfile) -> CostModel:
    """A cost model of ``model`` at unit rates (only its counting of work is used)."""
    unit = HardwareProfile(
        name="unit",
        description="unit rates",
        tp=1,
        memory_bytes_per_gpu=1 << 60,
        memory_bandwidth_bytes_per_s=1.0,
        peak_flops_per_s=1.0,
        host_link_bytes_per_s=1.0,
        compute_efficiency=1.0,
        bandwidth_efficiency=1.0,
        reserve_bytes_per_gpu=1,
    )
    return CostModel(unit, model, dtype_bytes=SIM_DTYPE_BYTES)


def _predict(work: tuple[float, float, int], rates: _Rates, overlap: float) -> float:
    flops, nbytes, sequences = work
    c, m = flops / rates.flops_per_s, nbytes / rates.bytes_per_s
    overhead = rates.step_overhead_s + sequences * rates.sequence_overhead_s
    return max(c, m) + (1.0 - overlap) * min(c, m) + overhead


def _fit_rates(
    works: list[tuple[float, float, int]], times: np.ndarray, overlap: float
) -> _Rates | None:
    """Return the rates that fit ``times`` best in relative error at ``overlap``, the
    overheads non-negative; ``None`` if no positive rates fit.

    With each step's bound (compute or memory) fixed, a step's time is linear in the two
    overheads and the two inverse rates; the bounds are re-read from the last fit until
    they settle.
    """
    flops = np.array([w[0] for w in works])
    nbytes = np.array([w[1] for w in works])
    sequences = np.array([float(w[2]) for w in works])
    inv_f = float(np.median(times / flops))  # a start: every step compute-bound ...
    inv_b = float(np.min(times / nbytes))  # ... at the rate of the fastest read
    weight = 1.0 / times
    for _ in range(50):
        compute_bound = flops * inv_f >= nbytes * inv_b
        a = np.where(compute_bound, 1.0, 1.0 - overlap)
        b = np.where(compute_bound, 1.0 - overlap, 1.0)
        columns = np.stack([np.ones_like(times), sequences, a * flops, b * nbytes], axis=1)
        free = [0, 1, 2, 3]
        while True:
            solution = np.zeros(4)
            fitted, *_ = np.linalg.lstsq(columns[:, free] * weight[:, None], times * weight)
            solution[free] = fitted
            negative = [i for i in free if solution[i] < 0 and i < 2]
            if not negative:
                break
            free = [i for i in free if i not in negative]  # an overhead of 0
        if solution[2] <= 0 or solution[3] <= 0:
            return None
        settled = abs(solution[2] - inv_f) <= 1e-9 * inv_f and abs(solution[3] - inv_b) <= (
            1e-9 * inv_b
        )
        inv_f, inv_b = float(solution[2]), float(solution[3])
        if settled:
            break
    return _Rates(float(solution[0]), float(solution[1]), 1.0 / inv_f, 1.0 / inv_b)


def fit_profile(
    calibration: Calibration, model: ModelProfile, name: str, description: str
) -> HardwareProfile:
    """Return the hardware profile whose refined roofline reproduces ``calibration`` for
    ``model`` (see the module docstring), with a source line for every number.

    Raises:
        ValueError: a time not above 0, or measurements no positive rates fit.
    """
    cal = calibration
    if not cal.points or any(p.step_s <= 0 for p in cal.points):
        raise ValueError("calibration times must be > 0")
    unit = _unit_cost(model)
    works = [_work(p, unit) for p in cal.points]
    times = np.array([p.step_s for p in cal.points])
    best: tuple[float, float, _Rates] | None = None
    for overlap in OVERLAPS:
        rates = _fit_rates(works, times, overlap)
        if rates is None:
            continue
        predicted = np.array([_predict(w, rates, overlap) for w in works])
        error = float(np.sqrt(np.mean((predicted / times - 1.0) ** 2)))
        if best is None or error < best[0] - 1e-12:
            best = (error, overlap, rates)
    if best is None:
        raise ValueError("no positive compute and memory rates fit the measurements")
    error, overlap, rates = best
    link = cal.reload_bytes_per_s * SIM_DTYPE_BYTES / cal.engine_dtype_bytes
    on_gpu = cal.device.startswith("cuda")
    memory = cal.device_memory_bytes or device_memory_bytes(torch.device("cpu"))
    when = datetime.date.today().isoformat()
    by = f"pbkv calibrate on {platform.node() or 'this machine'}, {when}, {cal.threads} threads"
    fitted = (
        f"{by}: fitted with the other refined-roofline figures to {len(cal.points)} forwards "
        f"({_listed(cal.points)}), rms error {error:.1%}"
    )
    sources = {
        "tp": f"one process on {cal.device}",
        "memory_bytes_per_gpu": (
            f"{cal.device}'s total memory (torch.cuda)"
            if on_gpu
            else "physical memory (os.sysconf); the bench sizes tiers in tokens"
        ),
        "memory_bandwidth_bytes_per_s": (
            f"{fitted}; in the sim's 2-byte units (the engine runs "
            f"{cal.engine_dtype_bytes}-byte weights)"
        ),
        "peak_flops_per_s": f"{fitted}; at 2*P FLOPs a prefill token",
        "step_overhead_s": f"{fitted}; what every forward costs beyond its roofline",
        "sequence_overhead_s": f"{fitted}; what each sequence in a forward adds",
        "overlap": f"{fitted}; the best of 0, 0.05, ..., 1",
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
        memory_bytes_per_gpu=int(memory),
        memory_bandwidth_bytes_per_s=rates.bytes_per_s,
        peak_flops_per_s=rates.flops_per_s,
        host_link_bytes_per_s=link,
        compute_efficiency=1.0,
        bandwidth_efficiency=1.0,
        reserve_bytes_per_gpu=2 * 2**30,
        step_overhead_s=rates.step_overhead_s,
        sequence_overhead_s=rates.sequence_overhead_s,
        overlap=overlap,
        sources=sources,
    )


def _listed(points: Sequence[StepPoint]) -> str:
    return ", ".join(f"{p.what}: {p.step_s * 1e3:.0f} ms" for p in points)


class Check(NamedTuple):
    """One measured figure beside the fitted profile's prediction of it."""

    what: str
    measured_s: float
    predicted_s: float


def check_profile(
    calibration: Calibration, hardware: HardwareProfile, model: ModelProfile
) -> list[Check]:
    """Return every measured forward beside what the sim predicts for it with ``hardware``."""
    cost = CostModel(hardware, model, dtype_bytes=SIM_DTYPE_BYTES)
    return [
        Check(
            p.what,
            p.step_s,
            cost.step_s(list(p.chunks), p.batch, p.batch * (p.context_tokens + 1)),
        )
        for p in calibration.points
    ]


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
        "step_overhead_s",
        "sequence_overhead_s",
        "overlap",
    ):
        if field not in hardware.sources:
            continue  # a refinement left at the roofline's default
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
    if calibration.device.startswith("cuda"):
        gpu = torch.cuda.get_device_name(torch.device(calibration.device))
        description = f"this machine's {gpu} ({calibration.device}), torch engine"
    else:
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
