"""Tests for engines/torchengine/calibrate.py: the fit, the profile file, and a short
measurement on the tiny model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.profile import load_hardware
from pbkv.engines.sim.profile import load_model as load_model_profile
from pbkv.engines.torchengine import load_model
from pbkv.engines.torchengine.calibrate import (
    DEFAULT_POINTS,
    Calibration,
    StepPoint,
    calibrate,
    check_profile,
    fit_profile,
    profile_toml,
)

SMOLLM2 = load_model_profile("smollm2-135m")
POINTS = (
    *(StepPoint(((n, 0),), 0, 0, 0.0) for n in (32, 128, 512)),
    *(StepPoint((), b, k, 0.0) for b, k in DEFAULT_POINTS),
    *(StepPoint(((n, 0),), 4, 512, 0.0) for n in (32, 128)),
)
"""The forwards ``calibrate`` measures by default (times left out)."""


def consistent(**figures: float) -> Calibration:
    """Measurements a hardware profile with these figures (sim units) gives exactly."""
    roofline = {"step_overhead_s": 0.0, "sequence_overhead_s": 0.0, "overlap": 1.0}
    hw = dataclasses.replace(load_hardware("cpu-2core"), **{**roofline, **figures})
    cost = CostModel(hw, SMOLLM2)
    points = tuple(
        p._replace(step_s=cost.step_s(list(p.chunks), p.batch, p.batch * (p.context_tokens + 1)))
        for p in POINTS
    )
    return Calibration(points, 8e9, engine_dtype_bytes=4, threads=2)


ROOFLINE = {"peak_flops_per_s": 8e10, "memory_bandwidth_bytes_per_s": 3e9}
CPU_LIKE = {
    **ROOFLINE,
    "step_overhead_s": 0.01,
    "sequence_overhead_s": 0.004,
    "overlap": 0.0,
}


@pytest.mark.parametrize("figures", [ROOFLINE, CPU_LIKE, {**CPU_LIKE, "overlap": 0.6}])
def test_the_fit_recovers_the_figures_that_made_the_measurements(figures) -> None:
    hw = fit_profile(consistent(**figures), SMOLLM2, "cpu-test", "a test CPU")
    for name, value in figures.items():
        assert getattr(hw, name) == pytest.approx(value, rel=1e-6, abs=1e-9), name
    assert hw.host_link_bytes_per_s == pytest.approx(4e9)  # 8 GB/s of fp32 = 4 of 2-byte
    assert (hw.compute_efficiency, hw.bandwidth_efficiency, hw.tp) == (1.0, 1.0, 1)
    checks = check_profile(consistent(**figures), hw, SMOLLM2)
    assert [c.what for c in checks][:4] == [
        "prefill 32",
        "prefill 128",
        "prefill 512",
        "decode b=1 k=512",
    ]
    assert checks[-1].what == "decode b=4 k=512 + prefill 128"
    for check in checks:
        assert check.predicted_s == pytest.approx(check.measured_s, rel=1e-6)


def test_a_decode_that_hides_no_prefill_fits_no_overlap() -> None:
    """A CPU-like machine: the chunk beside the decodes costs its full compute."""
    hw = fit_profile(consistent(**CPU_LIKE), SMOLLM2, "cpu-test", "a test CPU")
    cost = CostModel(hw, SMOLLM2)
    assert hw.overlap == 0.0
    assert cost.prefill_slack_tokens(4, 4 * 513) == 0
    roofline = CostModel(fit_profile(consistent(**ROOFLINE), SMOLLM2, "gpu", "a"), SMOLLM2)
    assert roofline.prefill_slack_tokens(4, 4 * 513) > 16


def test_the_profile_file_loads_back_with_a_source_for_every_number(tmp_path) -> None:
    hw = fit_profile(consistent(**CPU_LIKE), SMOLLM2, "cpu-test", 'a "quoted" CPU')
    path = tmp_path / "cpu-test.toml"
    path.write_text(profile_toml(hw), encoding="utf-8")
    loaded = load_hardware(path)
    assert loaded.description == 'a "quoted" CPU'
    assert loaded.memory_bandwidth_bytes_per_s == pytest.approx(3e9, rel=1e-5)
    assert loaded.sequence_overhead_s == pytest.approx(0.004, rel=1e-5)
    assert loaded.overlap == 0.0
    assert set(loaded.sources) == set(hw.sources)
    CostModel(loaded, SMOLLM2)  # the model fits its memory


def test_the_shipped_cpu_profile_predicts_its_own_prefill_rate() -> None:
    cost = CostModel(load_hardware("cpu-2core"), SMOLLM2)
    assert 200 < 512 / cost.prefill_s(512) < 600  # tokens/s, as measured on SmolLM2


def test_a_short_calibration_of_the_tiny_model_measures_every_step() -> None:
    model = load_model("tiny", device="cpu")
    cal = calibrate(model, prefill_tokens=32, points=((1, 16), (2, 16)), steps=2, repeats=1)
    assert [p.what for p in cal.points] == [
        "prefill 2",
        "prefill 8",
        "prefill 32",
        "decode b=1 k=16",
        "decode b=2 k=16",
        "decode b=2 k=16 + prefill 2",
        "decode b=2 k=16 + prefill 8",
    ]
    assert all(p.step_s > 0 for p in cal.points)
    assert cal.reload_bytes_per_s > 0 and cal.engine_dtype_bytes == 4
    assert cal.threads == torch.get_num_threads()
    with pytest.raises(ValueError, match=">= 1"):
        calibrate(model, steps=0)


def test_a_gpu_calibration_sizes_the_profile_by_the_gpus_memory() -> None:
    """On CUDA the profile's memory is the device's, not the host's RAM."""
    import dataclasses

    on_gpu = dataclasses.replace(
        consistent(**ROOFLINE), device="cuda:0", device_memory_bytes=80 * 2**30
    )
    hw = fit_profile(on_gpu, SMOLLM2, "gpu-test", "a test GPU")
    assert hw.memory_bytes_per_gpu == 80 * 2**30
    assert "cuda:0" in hw.sources["memory_bytes_per_gpu"] and "cuda:0" in hw.sources["tp"]
    on_cpu = fit_profile(consistent(**ROOFLINE), SMOLLM2, "cpu-test", "a test CPU")
    assert "os.sysconf" in on_cpu.sources["memory_bytes_per_gpu"]
