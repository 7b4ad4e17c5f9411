"""The latency floor: no sim run beats it, and it is exact where nothing is contested."""

import dataclasses

import numpy as np
import pytest

from pbkv.actors.events import RAN_TO_END
from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.bench.compare import BenchConfig, run_bench, run_policy
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.floor import MEASURED_REASONS, latency_floor
from pbkv.engines.sim.profile import load_hardware, load_model

COST = CostModel(load_hardware("a6000-tp2"), load_model("qwen3-32b"))


def test_decode_run_is_the_sum_of_its_decode_steps():
    contexts = np.random.default_rng(0).integers(0, 40_000, 300)
    run = COST.decode_run(contexts)
    assert run.seconds == pytest.approx(sum(COST.decode_step_s(1, int(k)) for k in contexts), 1e-12)
    assert run.flops == pytest.approx(sum(COST.decode_flops(1, int(k)) for k in contexts), 1e-12)
    assert COST.decode_run(np.array([], dtype=np.int64)) == (0.0, 0.0)
    with pytest.raises(ValueError, match="kv_tokens_read"):
        COST.decode_run(np.array([-1]))


@pytest.mark.parametrize("app", ["codegen", "hover"])
def test_one_workflow_alone_reaches_the_floor(app):
    # nothing is shared with another workflow and every block fits: the bound is the run
    config = BenchConfig(
        app=app, workflows=1, concurrency=1, policies=("lru",), gpu_kv_tokens=200_000
    )
    run = run_bench(config)
    latency = run.results[0].mean_latency_s
    assert run.bounds.floor_latency_s <= latency <= run.bounds.floor_latency_s * (1 + 1e-8)


@pytest.mark.parametrize(
    ("app", "gpu_kv_tokens", "host_kv_tokens"),
    [("hover", 12_000, 0), ("financebench", None, None), ("groupchat", 12_000, None)],
)
def test_no_policy_or_scheduler_beats_the_floor(app, gpu_kv_tokens, host_kv_tokens):
    specs = ("lru", "lru:workflow", "pbkv", "he:lpm", "lru:fcfs-balanced")
    config = BenchConfig(
        app=app,
        workflows=10,
        concurrency=5,
        policies=specs,
        train_workflows=20,
        gpu_kv_tokens=gpu_kv_tokens,
        host_kv_tokens=host_kv_tokens,
    )
    outcomes: dict[str, list] = {}
    run = run_bench(config, on_outcome=lambda spec, o: outcomes.setdefault(spec, []).append(o))
    floor = run.bounds.floor_latency_s
    assert floor > 0
    for r in run.results:
        assert r.mean_latency_s >= floor, (r.policy, r.scheduler)
    # the throughput bound rests on this closed-loop identity: with every start at a
    # finish, the latencies sum to the last `concurrency` finish times
    for spec, done in outcomes.items():
        ends = sorted(o.end_s for o in done)
        assert sum(o.latency_s for o in done) == pytest.approx(sum(ends[-5:]), rel=1e-12), spec


def _workflow(i: int, prompts: list[tuple[int, ...]], tenant: str = "") -> Workflow:
    steps = tuple(
        Step("a", (Segment("context", p),), output_token_ids=(7,) * 20, gap_s=0.5) for p in prompts
    )
    return Workflow(f"w{i}", "toy", f"t{i}", "", steps, tenant=tenant)


def test_a_block_is_free_only_when_another_request_could_have_computed_it():
    shared = tuple(range(1000, 1640))  # 40 blocks of 16
    alone = latency_floor([_workflow(0, [shared])], COST, block_size=16, concurrency=1)
    pair = [_workflow(0, [shared]), _workflow(1, [shared])]
    both = latency_floor(pair, COST, block_size=16, concurrency=2)
    assert both.isolated_s < alone.isolated_s  # each may find the other's blocks cached
    tenants = [_workflow(0, [shared], "x"), _workflow(1, [shared], "y")]
    apart = latency_floor(tenants, COST, block_size=16, concurrency=2)
    assert apart.isolated_s == pytest.approx(alone.isolated_s)  # tenants never share
    # a workflow's second call finds its first call's prompt and output cached
    again = shared + (7,) * 20 + tuple(range(5000, 5100))
    chain = latency_floor([_workflow(0, [shared, again])], COST, block_size=16, concurrency=1)
    cached = 660 // 16 * 16  # the full blocks of the first call's prompt + output
    second = 0.5 + COST.prefill_s(len(again) - cached, cached)
    second += COST.decode_run(np.arange(len(again) + 1, len(again) + 20)).seconds
    assert chain.isolated_s == pytest.approx(alone.isolated_s + second, rel=1e-8)


def test_a_workflow_left_out_of_the_mean_is_left_out_of_the_floor():
    # a script ending "error" (or "aborted") still runs and holds a slot, but the bench's
    # mean leaves its latency out: here it parks one of three slots in a 1,000 s gap, so
    # the eight measured, compute-bound workflows share two slots
    parked = _one_call(0, 100, 1, gap_s=1000.0, end_reason="error")
    flows = [_one_call(i, 8_000, 20) for i in range(1, 9)]
    config = BenchConfig(app="toy", workflows=9, concurrency=3, policies=("lru",))
    floor = latency_floor([parked, *flows], COST, block_size=16, concurrency=3)
    for spec in ("lru", "lru:fcfs-balanced", "pbkv:workflow"):
        row = run_policy([parked, *flows], config, spec, (), gpu_kv_tokens=100_000)
        assert row.end_reasons["error"] == 1
        assert floor.mean_latency_s <= row.mean_latency_s < 1.25 * floor.mean_latency_s, spec
    assert floor.throughput_s > floor.isolated_s  # the two-slot throughput bound binds
    # counting the parked workflow's 1,000 s, or giving the others all three slots,
    # would put the floor above the run
    all_slots = latency_floor(flows, COST, block_size=16, concurrency=3)
    assert all_slots.mean_latency_s > row.mean_latency_s
    assert set(MEASURED_REASONS) == set(RAN_TO_END)  # the floor's default is the bench's mean
    # with the parked one measured too, it is a workflow like the others again
    counted = dataclasses.replace(parked, end_reason="end")
    assert latency_floor([counted, *flows], COST, block_size=16, concurrency=3).isolated_s > 100


def _one_call(
    i: int, prompt_tokens: int, output_tokens: int, *, gap_s: float = 0.0, end_reason: str = "end"
) -> Workflow:
    prompt = tuple(range(10_000 * (i + 1), 10_000 * (i + 1) + prompt_tokens))
    step = Step("a", (Segment("context", prompt),), (7,) * output_tokens, gap_s)
    return Workflow(f"w{i}", "toy", f"t{i}", "", (step,), end_reason=end_reason)


def test_open_loop_keeps_only_the_isolated_bound():
    # sixteen disjoint, compute-bound workflows on two slots: the GPU is the limit
    flows = [_workflow(i, [tuple(range(i * 10_000, i * 10_000 + 8_000))]) for i in range(16)]
    closed = latency_floor(flows, COST, block_size=16, concurrency=2)
    opened = latency_floor(flows, COST, block_size=16, concurrency=2, open_loop=True)
    assert closed.throughput_s > closed.isolated_s
    assert closed.mean_latency_s == closed.throughput_s
    assert opened.throughput_s == 0.0
    assert opened.mean_latency_s == opened.isolated_s == closed.isolated_s


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="concurrency"):
        latency_floor([_workflow(0, [(1, 2, 3)])], COST, block_size=16, concurrency=0)
    with pytest.raises(ValueError, match="block_size"):
        latency_floor([_workflow(0, [(1, 2, 3)])], COST, block_size=0, concurrency=1)
    assert latency_floor([], COST, block_size=16, concurrency=1).mean_latency_s == 0.0


def test_the_bench_json_keeps_the_uncontested_run_beside_the_floor():
    config = BenchConfig(app="codegen", workflows=4, concurrency=2, policies=("lru",))
    b = run_bench(config).bounds
    assert b.uncontested_latency_s >= b.floor_latency_s > 0


def _random_workload(seed: int) -> tuple[list[Workflow], int, int]:
    """Small scripts built to probe the bound: a shared preamble (or identical scripts),
    one-token and block-edge prompts, long gaps, a second tenant, and every end reason."""
    rng = np.random.default_rng(seed)
    preamble = tuple(int(t) for t in rng.integers(0, 50_000, rng.choice([1, 16, 17, 600])))
    identical = rng.random() < 0.3
    flows = []
    for i in range(int(rng.integers(3, 9))):
        local = np.random.default_rng([seed, 0 if identical else i + 1])
        context: tuple[int, ...] = ()
        steps = []
        for j in range(int(local.integers(1, 4))):
            body = tuple(
                int(t) for t in local.integers(0, 50_000, local.choice([1, 16, 300, 2500]))
            )
            output = (7,) * int(local.choice([1, 2, 16, 60]))
            gap_s = float(local.choice([0.0, 0.0, 0.5, 200.0]))
            steps.append(
                Step("ab"[j % 2], (Segment("context", preamble + context + body),), output, gap_s)
            )
            context += body + output
        flows.append(
            Workflow(
                f"w{i}",
                "toy",
                f"t{i}",
                "",
                tuple(steps),
                end_reason=str(rng.choice(["end"] * 5 + ["recursion_limit", "error", "aborted"])),
                tenant="" if identical else str(rng.choice(["", "", "x"])),
            )
        )
    largest = max(s.prompt_tokens + s.output_tokens for w in flows for s in w.steps)
    return flows, int(rng.integers(1, 6)), int(largest * rng.choice([1.1, 3.0, 30.0])) + 64


@pytest.mark.parametrize("seed", range(6))
def test_no_run_of_a_probing_workload_beats_the_floor(seed):
    flows, concurrency, gpu_kv_tokens = _random_workload(seed)
    config = BenchConfig(app="toy", workflows=len(flows), concurrency=concurrency)
    floor = latency_floor(flows, COST, block_size=16, concurrency=concurrency)
    for spec in ("lru", "pbkv:workflow-retract", "he:lpm"):
        row = run_policy(flows, config, spec, (), gpu_kv_tokens=gpu_kv_tokens)
        if row.end_reasons["end"] + row.end_reasons["recursion_limit"]:
            assert row.mean_latency_s >= floor.mean_latency_s, spec


def test_a_step_with_no_recorded_output_replays_as_one_token_and_keeps_its_floor():
    flows = [_workflow(0, [tuple(range(100, 200))]), _workflow(1, [tuple(range(300, 400))])]
    empty = Step("a", (Segment("context", tuple(range(500, 600))),), output_token_ids=())
    flows.append(Workflow("w2", "toy", "t2", "", (empty,)))
    config = BenchConfig(app="toy", workflows=3, concurrency=2, policies=("lru",))
    row = run_policy(flows, config, "lru", (), gpu_kv_tokens=100_000)
    assert row.end_reasons["end"] == 3
    floor = latency_floor(flows, COST, block_size=16, concurrency=2)
    assert row.mean_latency_s >= floor.mean_latency_s
