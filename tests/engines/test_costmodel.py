"""Tests for engines/sim/costmodel.py and the profiles it reads (engines/sim/profile.py)."""

from __future__ import annotations

import dataclasses
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from pbkv.engines.sim.costmodel import CostModel, PrefillChunk
from pbkv.engines.sim.profile import (
    HardwareProfile,
    ModelProfile,
    ProfileError,
    list_profiles,
    load_hardware,
    load_model,
)

PROFILE_DIR = Path(__file__).resolve().parents[2] / "engines" / "sim" / "profiles"
GB = 1e9


@pytest.fixture
def tp2_32b() -> CostModel:
    return CostModel(load_hardware("a6000-tp2"), load_model("qwen3-32b"))


# Profiles: registry, sources, shapes


def test_list_profiles_names_every_shipped_profile_by_kind() -> None:
    names = list_profiles()
    assert names.hardware == ("a6000", "a6000-tp2", "cpu-2core", "h200")
    assert names.model == ("qwen3-14b", "qwen3-32b", "smollm2-135m")


@pytest.mark.parametrize("name", list_profiles().hardware)
def test_shipped_hardware_profile_cites_a_source_for_every_number(name: str) -> None:
    """Every required number, and every refinement of the roofline the file sets (those
    it leaves out keep the roofline's defaults)."""
    profile = load_hardware(name)
    fields = dataclasses.fields(HardwareProfile)
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    numbers = required - {"name", "description", "sources"}
    refined = {f.name for f in fields if f.default is not dataclasses.MISSING} - {"sources"}
    assert numbers <= set(profile.sources) <= numbers | refined
    for field in refined - set(profile.sources):
        assert getattr(profile, field) == next(f.default for f in fields if f.name == field)
    assert all(source.strip() for source in profile.sources.values())


@pytest.mark.parametrize("name", list_profiles().model)
def test_shipped_model_profile_cites_a_source_for_every_number(name: str) -> None:
    profile = load_model(name)
    numbers = {f.name for f in dataclasses.fields(ModelProfile)} - {
        "name",
        "description",
        "sources",
    }
    assert set(profile.sources) == numbers


def test_qwen3_shapes_match_their_config_json() -> None:
    big, small = load_model("qwen3-32b"), load_model("qwen3-14b")
    assert (big.num_layers, big.num_attention_heads, big.num_kv_heads) == (64, 64, 8)
    assert (big.head_dim, big.hidden_size) == (128, 5120)
    assert 32.7e9 < big.num_params < 32.9e9
    assert (small.num_layers, small.num_attention_heads, small.num_kv_heads) == (40, 40, 8)
    assert (small.head_dim, small.hidden_size) == (128, 5120)
    assert 14.7e9 < small.num_params < 14.9e9


def test_loading_from_an_explicit_path_equals_loading_by_name(tmp_path: Path) -> None:
    copy = tmp_path / "a6000-tp2.toml"
    copy.write_text((PROFILE_DIR / "a6000-tp2.toml").read_text())
    assert load_hardware(copy) == load_hardware("a6000-tp2")
    assert load_hardware(str(copy)) == load_hardware("a6000-tp2")
    assert load_model(PROFILE_DIR / "qwen3-14b.toml") == load_model("qwen3-14b")


def test_profiles_survive_pickling() -> None:
    profile = load_hardware("h200")
    assert pickle.loads(pickle.dumps(profile)) == profile


# Profiles: errors


def test_unknown_hardware_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown hardware profile 'b200'") as info:
        load_hardware("b200")
    for known in list_profiles().hardware:
        assert known in str(info.value)


def test_a_model_name_is_not_a_hardware_profile() -> None:
    with pytest.raises(ValueError, match="known model profiles: qwen3-14b, qwen3-32b"):
        load_model("a6000")


def _write_broken(tmp_path: Path, source: str, old: str, new: str) -> Path:
    text = (PROFILE_DIR / source).read_text()
    assert old in text
    path = tmp_path / source
    path.write_text(text.replace(old, new, 1))
    return path


def test_malformed_value_error_names_file_line_and_field(tmp_path: Path) -> None:
    path = _write_broken(
        tmp_path,
        "a6000-tp2.toml",
        "bandwidth_efficiency = 0.75\n",
        "bandwidth_efficiency = 1.5\n",
    )
    line = path.read_text().splitlines().index("bandwidth_efficiency = 1.5") + 1
    with pytest.raises(ProfileError) as info:
        load_hardware(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ")
    assert "'bandwidth_efficiency' must be in (0, 1], got 1.5" in message
    assert info.value.field_name == "bandwidth_efficiency"


def test_wrongly_typed_value_error_names_the_field(tmp_path: Path) -> None:
    path = _write_broken(tmp_path, "qwen3-32b.toml", "num_layers = 64", 'num_layers = "64"')
    with pytest.raises(ProfileError, match=r"qwen3-32b\.toml:\d+: field 'num_layers' must be an"):
        load_model(path)


def test_missing_field_error_names_the_field(tmp_path: Path) -> None:
    path = _write_broken(tmp_path, "h200.toml", "\ntp = 1\n", "\n")
    with pytest.raises(ProfileError, match=r"h200\.toml: missing field 'tp'"):
        load_hardware(path)


def test_misspelt_field_error_names_the_field(tmp_path: Path) -> None:
    path = _write_broken(tmp_path, "a6000.toml", "\ntp = 1\n", "\ntp = 1\ntpp = 1\n")
    with pytest.raises(ProfileError, match=r"a6000\.toml:\d+: unknown field 'tpp'"):
        load_hardware(path)


def test_wrong_kind_error_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "copy.toml"
    path.write_text((PROFILE_DIR / "qwen3-14b.toml").read_text())
    with pytest.raises(ProfileError, match=r"copy\.toml:\d+: field 'kind' must be 'hardware'"):
        load_hardware(path)


def test_invalid_toml_error_names_the_file(tmp_path: Path) -> None:
    path = _write_broken(tmp_path, "a6000.toml", "tp = 1", "tp = = 1")
    with pytest.raises(ProfileError, match=re.escape(f"{path}: invalid TOML")):
        load_hardware(path)


def test_constructing_a_profile_validates_it() -> None:
    with pytest.raises(ProfileError, match="'tp' must be > 0, got 0"):
        dataclasses.replace(load_hardware("a6000"), tp=0)


# Cost model: the worked numbers of DESIGN §7.1 (a6000-tp2 x qwen3-32b)


def test_kv_bytes_per_token_is_exact(tp2_32b: CostModel) -> None:
    assert tp2_32b.tp == 2
    assert tp2_32b.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 262_144
    assert tp2_32b.kv_bytes_per_token_per_gpu == 131_072


def test_kv_bytes_scale_with_dtype() -> None:
    fp32 = CostModel(load_hardware("h200"), load_model("qwen3-14b"), dtype_bytes=4)
    assert fp32.kv_bytes_per_token == 2 * 40 * 8 * 128 * 4


def test_weights_are_about_65_5_gb_split_in_two(tp2_32b: CostModel) -> None:
    assert tp2_32b.weight_bytes == tp2_32b.model.num_params * 2
    assert tp2_32b.weight_bytes == pytest.approx(65.5 * GB, rel=0.005)
    assert tp2_32b.weight_bytes_per_gpu == tp2_32b.weight_bytes // 2
    assert tp2_32b.weight_bytes_per_gpu == pytest.approx(32.8 * GB, rel=0.005)


def test_kv_capacity_of_the_pair_is_50k_to_60k_tokens(tp2_32b: CostModel) -> None:
    hw = tp2_32b.hardware
    free_per_gpu = hw.memory_bytes_per_gpu - tp2_32b.weight_bytes_per_gpu
    free_per_gpu -= hw.reserve_bytes_per_gpu
    expected = free_per_gpu // 131_072
    assert tp2_32b.gpu_kv_capacity_tokens == expected
    assert 50_000 <= tp2_32b.gpu_kv_capacity_tokens <= 60_000
    assert tp2_32b.gpu_kv_capacity_bytes == expected * 262_144


def test_batch1_decode_reads_the_weights_in_about_43_ms(tp2_32b: CostModel) -> None:
    hw = tp2_32b.hardware
    full_bandwidth_s = tp2_32b.weight_bytes_per_gpu / hw.memory_bandwidth_bytes_per_s
    assert full_bandwidth_s == pytest.approx(0.043, abs=0.001)
    # One token of context: the step is the weight read (plus one token of KV) at the
    # profile's achieved bandwidth, i.e. ~43 ms / bandwidth_efficiency.
    step_bytes = tp2_32b.weight_bytes_per_gpu + tp2_32b.kv_bytes_per_token_per_gpu
    expected = step_bytes / (hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency)
    assert tp2_32b.decode_step_s(1, 1) == pytest.approx(expected, rel=1e-12)
    assert tp2_32b.decode_step_s(1, 1) == pytest.approx(0.043 / hw.bandwidth_efficiency, rel=0.01)


def test_prefill_is_compute_bound_with_the_stated_formula(tp2_32b: CostModel) -> None:
    hw, m = tp2_32b.hardware, tp2_32b.model
    n, cached = 4096, 1000
    flops = 2 * m.num_params * n
    flops += 4 * m.num_layers * m.num_attention_heads * m.head_dim * (n * cached + n * (n + 1) / 2)
    expected = flops / (hw.peak_flops_per_s * hw.compute_efficiency * 2)
    cost = tp2_32b.step_cost([(n, cached)], 0, 0)
    assert cost.compute_s > cost.memory_s
    assert tp2_32b.prefill_s(n, cached) == pytest.approx(expected, rel=1e-12)


def test_short_prefill_never_beats_one_read_of_the_weights(tp2_32b: CostModel) -> None:
    hw = tp2_32b.hardware
    weight_read_s = tp2_32b.weight_bytes_per_gpu / (
        hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency
    )
    assert tp2_32b.prefill_s(1, 0) >= weight_read_s
    assert tp2_32b.prefill_s(1, 0) == pytest.approx(weight_read_s, rel=1e-4)


def test_transfer_time_is_bytes_over_bandwidth(tp2_32b: CostModel) -> None:
    assert tp2_32b.bandwidth_bytes_per_s == 2 * tp2_32b.hardware.host_link_bytes_per_s
    num_bytes = 1000 * tp2_32b.kv_bytes_per_token
    assert tp2_32b.transfer_s(num_bytes) == num_bytes / tp2_32b.bandwidth_bytes_per_s
    assert tp2_32b.transfer_s(0) == 0.0


# Cost model: shape of the curves


@pytest.mark.parametrize("new_tokens", [1, 512, 4096])
def test_more_cached_tokens_cost_more_attention(tp2_32b: CostModel, new_tokens: int) -> None:
    costs = [tp2_32b.step_cost([(new_tokens, m)], 0, 0) for m in (0, 1024, 8192, 32768)]
    flops = [c.flops for c in costs]
    assert flops == sorted(flops) and len(set(flops)) == len(flops)
    times = [tp2_32b.prefill_s(new_tokens, m) for m in (0, 1024, 8192, 32768)]
    assert times == sorted(times)


def test_larger_decode_batch_is_never_faster(tp2_32b: CostModel) -> None:
    times = [tp2_32b.decode_step_s(b, b * 2048) for b in (1, 2, 8, 32, 128, 512)]
    assert times == sorted(times)
    same_context = [tp2_32b.decode_step_s(b, 8192) for b in (1, 8, 64, 1024)]
    assert same_context == sorted(same_context)


def test_decode_is_bandwidth_bound_at_small_batch(tp2_32b: CostModel) -> None:
    cost = tp2_32b.step_cost([], 8, 8 * 4096)
    assert cost.memory_s > cost.compute_s


def test_mixed_step_reads_the_weights_once(tp2_32b: CostModel) -> None:
    chunks = [PrefillChunk(512, 2048), PrefillChunk(256, 0)]
    mixed = tp2_32b.step_cost(chunks, 16, 16 * 1024)
    alone = [tp2_32b.step_cost([c], 0, 0) for c in chunks] + [tp2_32b.step_cost([], 16, 16384)]
    assert mixed.flops == pytest.approx(sum(c.flops for c in alone), rel=1e-12)
    shared_weights = 2 * tp2_32b.weight_bytes_per_gpu
    assert mixed.bytes_per_gpu == sum(c.bytes_per_gpu for c in alone) - shared_weights
    assert mixed.step_s == max(mixed.compute_s, mixed.memory_s)
    assert tp2_32b.step_s(chunks, 16, 16 * 1024) == mixed.step_s
    assert mixed.step_s < sum(c.step_s for c in alone)


def test_empty_step_costs_nothing(tp2_32b: CostModel) -> None:
    assert tp2_32b.step_s([], 0, 0) == 0.0


# Cost model: misuse


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.prefill_s(0, 10), r"prefill_chunks\[0\]: new_tokens must be >= 1"),
        (lambda c: c.prefill_s(10, -1), r"prefill_chunks\[0\]: cached_tokens must be >= 0"),
        (lambda c: c.decode_step_s(0, 0), "batch_size must be >= 1"),
        (lambda c: c.decode_step_s(1, -5), "decode_kv_tokens must be >= 0"),
        (lambda c: c.step_s([], 0, 100), "decode_kv_tokens=100 with decode_batch=0"),
        (lambda c: c.transfer_s(-1), "num_bytes must be >= 0"),
    ],
)
def test_bad_counts_raise_value_error_naming_the_argument(
    tp2_32b: CostModel, call: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call(tp2_32b)  # type: ignore[operator]


def test_a_model_that_does_not_fit_is_rejected() -> None:
    with pytest.raises(ValueError, match="'qwen3-32b' does not fit on hardware 'a6000'"):
        CostModel(load_hardware("a6000"), load_model("qwen3-32b"))


def test_heads_must_split_across_tp() -> None:
    odd = dataclasses.replace(load_model("qwen3-14b"), num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads=3 does not split across tp=2"):
        CostModel(load_hardware("a6000-tp2"), odd)


def test_dtype_bytes_must_be_a_positive_integer() -> None:
    with pytest.raises(ValueError, match="dtype_bytes must be positive"):
        CostModel(load_hardware("h200"), load_model("qwen3-14b"), dtype_bytes=0)


# Every shipped pairing the paper and DESIGN name


@pytest.mark.parametrize(
    ("hardware", "model"),
    [("a6000-tp2", "qwen3-32b"), ("a6000", "qwen3-14b"), ("h200", "qwen3-32b")],
)
def test_named_pairings_fit_and_follow_the_roofline(hardware: str, model: str) -> None:
    cost = CostModel(load_hardware(hardware), load_model(model))
    hw = cost.hardware
    assert cost.gpu_kv_capacity_tokens > 32_768
    weight_read_s = cost.weight_bytes_per_gpu / (
        hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency
    )
    assert cost.decode_step_s(1, 1) == pytest.approx(weight_read_s, rel=1e-4)
    assert cost.prefill_s(4096, 0) > cost.decode_step_s(1, 4096)


def test_prefill_slack_fills_the_decode_step_compute_and_no_more(tp2_32b: CostModel) -> None:
    batch, kv = 15, 60_000
    slack = tp2_32b.prefill_slack_tokens(batch, kv)
    decode = tp2_32b.step_cost([], batch, kv)
    per_token_s = 2 * tp2_32b.model.num_params / tp2_32b.compute_flops_per_s
    assert slack == int((decode.memory_s - decode.compute_s) / per_token_s)
    assert slack == 133  # a6000-tp2 x qwen3-32b: ~72 ms of reads, ~9 ms of decode compute
    # carrying the slack costs the decode step only its chunk's attention; twice it, a lot
    alone = tp2_32b.decode_step_s(batch, kv)
    assert tp2_32b.step_s([(slack, 0)], batch, kv) < alone * 1.01
    assert tp2_32b.step_s([(2 * slack, 0)], batch, kv) > alone * 1.5


def test_prefill_slack_of_an_empty_batch_fills_one_read_of_the_weights(
    tp2_32b: CostModel,
) -> None:
    slack = tp2_32b.prefill_slack_tokens(0, 0)
    assert slack == 120
    assert tp2_32b.prefill_s(slack) == pytest.approx(tp2_32b.decode_step_s(1, 1), rel=0.02)
    with pytest.raises(ValueError, match="decode_kv_tokens=5 with decode_batch=0"):
        tp2_32b.prefill_slack_tokens(0, 5)
    with pytest.raises(ValueError, match="decode_batch"):
        tp2_32b.prefill_slack_tokens(-1, 0)


def _step_cost_by_formula(cost: CostModel, chunks, batch: int, kv_tokens: int) -> tuple:
    """The step roofline as the module docstring writes it, through the public formulas."""
    if not chunks and batch == 0:
        return (0.0, 0.0, 0.0, 0.0)
    flops = cost.decode_flops(batch, kv_tokens)
    flops += sum(cost.prefill_flops(n, m) for n, m in chunks)
    touched = kv_tokens + sum(n + m for n, m in chunks)
    bytes_per_gpu = float(cost.weight_bytes_per_gpu + touched * cost.kv_bytes_per_token_per_gpu)
    return (
        flops,
        bytes_per_gpu,
        flops / cost.compute_flops_per_s,
        bytes_per_gpu / cost.memory_bandwidth_bytes_per_s_per_gpu,
    )


@pytest.mark.parametrize(("hardware", "model"), [("a6000-tp2", "qwen3-32b"), ("h200", "qwen3-14b")])
def test_step_times_give_the_formulas_floats_bit_for_bit(hardware: str, model: str) -> None:
    """step_cost, step_s, prefill_compute_s and prefill_slack_tokens take their constant
    factors once; every figure is the float the formulas give (simulated times must not
    move by a last bit)."""
    import random

    cost = CostModel(load_hardware(hardware), load_model(model))
    rng = random.Random(7)
    for _ in range(2000):
        chunks = [(rng.randint(1, 9000), rng.randint(0, 60000)) for _ in range(rng.randint(0, 4))]
        batch = rng.randint(0, 64)
        kv_tokens = rng.randint(0, 2_000_000) if batch else 0
        got = cost.step_cost(chunks, batch, kv_tokens)
        want = _step_cost_by_formula(cost, chunks, batch, kv_tokens)
        assert (got.flops, got.bytes_per_gpu, got.compute_s, got.memory_s) == want
        assert cost.step_cost(iter(chunks), batch, kv_tokens) == got  # any iterable
        assert cost.step_s(chunks, batch, kv_tokens) == max(want[2], want[3])
        if chunks:
            assert cost.prefill_compute_s(chunks) == _step_cost_by_formula(cost, chunks, 0, 0)[2]
        if batch:
            _, _, compute_s, memory_s = _step_cost_by_formula(cost, [], batch, kv_tokens)
            per_token_s = 2.0 * cost.model.num_params / cost.compute_flops_per_s
            slack = int(max(0.0, memory_s - compute_s) / per_token_s)
            assert cost.prefill_slack_tokens(batch, kv_tokens) == slack
    with pytest.raises(ValueError, match=r"prefill_chunks\[1\]: new_tokens must be >= 1"):
        cost.step_cost([(3, 0), (0, 5)], 1, 10)
    with pytest.raises(ValueError, match=r"prefill_chunks\[0\]: cached_tokens must be >= 0"):
        cost.step_cost([PrefillChunk(3, -1)], 0, 0)


def test_a_refined_step_adds_the_unhidden_part_and_the_overheads() -> None:
    """``max(c, m) + (1 - overlap) min(c, m) + step_overhead_s + sequences x
    sequence_overhead_s`` (a CPU-like profile); the roofline's floats at the defaults."""
    smollm2 = load_model("smollm2-135m")
    cpu = load_hardware("cpu-2core")
    roofline = dataclasses.replace(cpu, step_overhead_s=0.0, sequence_overhead_s=0.0, overlap=1.0)
    refined = dataclasses.replace(
        roofline, step_overhead_s=0.01, sequence_overhead_s=0.002, overlap=0.25
    )
    base, cost = CostModel(roofline, smollm2), CostModel(refined, smollm2)
    for chunks, batch, kv_tokens in (([(32, 0)], 4, 2000), ([], 1, 513), ([(512, 0)], 0, 0)):
        roof = base.step_cost(chunks, batch, kv_tokens)
        c, m = roof.compute_s, roof.memory_s
        want = max(c, m) + 0.75 * min(c, m) + 0.01 + 0.002 * (len(chunks) + batch)
        assert cost.step_s(chunks, batch, kv_tokens) == pytest.approx(want, rel=1e-12)
        assert cost.step_cost(iter(chunks), batch, kv_tokens).step_s == pytest.approx(want)
        assert base.step_s(chunks, batch, kv_tokens) == max(c, m)
    assert cost.step_s([], 0, 0) == 0.0  # nothing runs: no overhead either
    run = cost.decode_run(np.array([513, 514]))
    assert run.seconds == pytest.approx(cost.decode_step_s(1, 513) + cost.decode_step_s(1, 514))
    decode = base.step_cost([], 4, 2000)
    per_token_s = 2 * smollm2.num_params / base.compute_flops_per_s
    assert cost.prefill_slack_tokens(4, 2000) == int(
        0.25 * (decode.memory_s - decode.compute_s) / per_token_s
    )
    assert cost.forward_s() == pytest.approx(
        2 * cost.decode_step_s(1, 1) - cost.decode_step_s(2, 2)
    )
    assert cost.forward_s() == pytest.approx(base.forward_s() + 0.01)  # + the step's overhead
    assert cost.prefill_token_s() == per_token_s


def test_a_profile_may_leave_out_the_refinements_and_bounds_them() -> None:
    a6000 = load_hardware("a6000")
    assert (a6000.step_overhead_s, a6000.sequence_overhead_s, a6000.overlap) == (0.0, 0.0, 1.0)
    assert dataclasses.replace(a6000, overlap=0.0).overlap == 0.0
    with pytest.raises(ProfileError, match="'overlap' must be in \\[0, 1\\], got 1.5"):
        dataclasses.replace(a6000, overlap=1.5)
    with pytest.raises(ProfileError, match="'step_overhead_s' must be >= 0, got -0.1"):
        dataclasses.replace(a6000, step_overhead_s=-0.1)
