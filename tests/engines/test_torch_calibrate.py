"""Tests for engines/torchengine/calibrate.py: the fit, the profile file, and a short
measurement on the tiny model."""

from __future__ import annotations

import pytest
import torch

from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.profile import load_hardware
from pbkv.engines.sim.profile import load_model as load_model_profile
from pbkv.engines.torchengine import load_model
from pbkv.engines.torchengine.calibrate import (
    Calibration,
    DecodePoint,
    calibrate,
    check_profile,
    fit_profile,
    profile_toml,
)

SMOLLM2 = load_model_profile("smollm2-135m")


def consistent(flops_per_s: float, bytes_per_s: float) -> Calibration:
    """Measurements a roofline at these rates (sim units) would give exactly."""
    kv = 2 * 30 * 3 * 64 * 2
    weights = SMOLLM2.num_params * 2
    points = tuple(
        DecodePoint(b, k, (weights + b * (k + 1) * kv) / bytes_per_s)
        for b, k in ((1, 512), (4, 1024))
    )
    prefill_s = 2 * SMOLLM2.num_params * 512 / flops_per_s
    return Calibration(512, prefill_s, points, 8e9, engine_dtype_bytes=4, threads=2)


def test_the_fit_recovers_the_rates_that_made_the_measurements() -> None:
    hw = fit_profile(consistent(8e10, 3e9), SMOLLM2, "cpu-test", "a test CPU")
    assert hw.peak_flops_per_s == pytest.approx(8e10)
    assert hw.memory_bandwidth_bytes_per_s == pytest.approx(3e9)
    assert hw.host_link_bytes_per_s == pytest.approx(4e9)  # 8 GB/s of fp32 = 4 of 2-byte
    assert (hw.compute_efficiency, hw.bandwidth_efficiency, hw.tp) == (1.0, 1.0, 1)
    checks = check_profile(consistent(8e10, 3e9), hw, SMOLLM2)
    assert [c.what for c in checks] == [
        "prefill 512 tokens",
        "decode b=1 k=512",
        "decode b=4 k=1024",
    ]
    for check in checks[1:]:  # decode is bandwidth-bound at these rates: exact
        assert check.predicted_s == pytest.approx(check.measured_s)


def test_the_profile_file_loads_back_with_a_source_for_every_number(tmp_path) -> None:
    hw = fit_profile(consistent(8e10, 3e9), SMOLLM2, "cpu-test", 'a "quoted" CPU')
    path = tmp_path / "cpu-test.toml"
    path.write_text(profile_toml(hw), encoding="utf-8")
    loaded = load_hardware(path)
    assert loaded.description == 'a "quoted" CPU'
    assert loaded.memory_bandwidth_bytes_per_s == pytest.approx(3e9, rel=1e-5)
    assert set(loaded.sources) == set(hw.sources)
    CostModel(loaded, SMOLLM2)  # the model fits its memory


def test_the_shipped_cpu_profile_predicts_its_own_prefill_rate() -> None:
    cost = CostModel(load_hardware("cpu-2core"), SMOLLM2)
    assert 200 < 512 / cost.prefill_s(512) < 600  # tokens/s, as measured on SmolLM2


def test_a_short_calibration_of_the_tiny_model_measures_every_step() -> None:
    model = load_model("tiny", device="cpu")
    cal = calibrate(model, prefill_tokens=32, points=((1, 16), (2, 16)), steps=2, repeats=1)
    assert cal.prefill_tokens == 32 and cal.prefill_s > 0
    assert [(p.batch, p.context_tokens) for p in cal.decode] == [(1, 16), (2, 16)]
    assert all(p.step_s > 0 for p in cal.decode)
    assert cal.reload_bytes_per_s > 0 and cal.engine_dtype_bytes == 4
    assert cal.threads == torch.get_num_threads()
    with pytest.raises(ValueError, match=">= 1"):
        calibrate(model, steps=0)
