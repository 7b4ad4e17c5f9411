"""The bench's report: speedups, what won, the gain by part, bounds apart, 100 columns."""

import dataclasses
import json
import math

import pytest
from rich.console import Console

from pbkv.bench.compare import BenchConfig, Bounds, PolicyResult
from pbkv.bench.report import (
    TABLE_WIDTH,
    GainDecomposition,
    GainPart,
    comparison_table,
    fastest_result,
    gain_decomposition,
    ratio_text,
    strongest_baseline,
    won_text,
    write_json,
)
from pbkv.kvmanager.stats import KVStatistics

NAN = float("nan")


def row(spec, latency_s, gpu=0.5, host=0.25, retractions=0, predictor=None):
    """Return a hand-made row for ``policy:scheduler`` with mean latency ``latency_s``."""
    policy, scheduler = spec.split(":")
    kv = KVStatistics(policy, 10, 1000, 500, 250, 250, *[0] * 11)
    forecasts = policy in ("he", "pbkv", "pbkv-aggressive")
    return PolicyResult(
        policy=policy,
        predictor=predictor or ("online" if forecasts else "-"),
        workflows=16,
        failed_workflows=0,
        mean_latency_s=latency_s,
        p50_latency_s=latency_s,
        p99_latency_s=2 * latency_s,
        mean_ttft_s=0.5,
        gpu_hit_rate=gpu,
        host_hit_rate=host,
        total_hit_rate=gpu + host,
        recomputed_tokens=71_593,
        throughput_workflows_per_s=0.1,
        makespan_s=10 * latency_s,
        kv=kv,
        wall_s=1.0,
        end_reasons={"end": 15, "recursion_limit": 1},
        scheduler=scheduler,
        retractions=retractions,
    )


LADDER = {
    "lru:fcfs": 240.0,
    "lru:fcfs-balanced": 192.0,
    "lru:workflow": 160.0,
    "he:workflow": 128.0,
    "pbkv:workflow": 120.0,
}
BOUNDS = Bounds(
    ceiling_hit_rate=0.9,
    floor_latency_s=100.0,
    min_hit_rate=0.8,
    min_total_hit_rate=0.9,
    min_order="lru:fcfs",
    uncontested_latency_s=150.0,
)


POLICY_ROWS = """\
                     mean     p99    mean   GPU  host  recomputed  speedup  speedup
policy:scheduler    lat s   lat s  TTFT s  hit%  hit%         tok   vs lru  vs best      ends
─────────────────────────────────────────────────────────────────────────────────────────────
lru:fcfs           240.00  480.00   0.500  50.0  25.0      71,593   1.000x   0.533x  15/1/0/0
lru:fcfs-balanced  192.00  384.00   0.500  50.0  25.0      71,593   1.250x   0.667x  15/1/0/0
lru:workflow       160.00  320.00   0.500  50.0  25.0      71,593   1.500x   0.800x  15/1/0/0
he:workflow        128.00  256.00   0.500  50.0  25.0      71,593   1.875x   1.000x  15/1/0/0
pbkv:workflow      120.00  240.00   0.500  50.0  25.0      71,593   2.000x   1.067x  15/1/0/0
speedup: vs lru is lru:fcfs's mean latency over the row's; vs best is the strongest"""

GAIN_ROWS = """\
batching    1.250x  lru:fcfs -> lru:fcfs-balanced      stall-free batches (vLLM V1); any engine
admission   1.200x  lru:fcfs-balanced -> lru:workflow  the workflow scheduler's admission order
eviction    1.250x  lru:workflow -> he:workflow        forecast-scored eviction (he)
prefetch    1.067x  he:workflow -> pbkv:workflow       pbkv over he: prefetch, queued prefixes, age
= total     2.000x  lru:fcfs -> pbkv:workflow          the product of the parts"""

JOINED_PART = """\
batching +     2.000x  lru:fcfs -> pbkv:workflow  lru:fcfs-balanced, lru:workflow, he:workflow would
admission +                                       split it
cache policy"""


def rows(*specs, **latencies):
    return [row(spec, latencies.get(spec, LADDER[spec])) for spec in specs]


def render(renderable, width=200):
    console = Console(width=width, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_strongest_baseline_is_the_fastest_row_not_pbkvs():
    results = [
        row("lru:fcfs", 200.0),
        row("he:fcfs", NAN),  # measured no workflow
        row("lru:workflow", 150.0),
        row("pbkv:workflow", 120.0),
        row("pbkv-aggressive:workflow", 100.0),
        row("kvflow:workflow", 150.0),  # as fast as lru:workflow: the first counts
    ]
    assert (strongest_baseline(results).policy, strongest_baseline(results).scheduler) == (
        "lru",
        "workflow",
    )
    assert fastest_result(results).policy == "pbkv-aggressive"
    assert strongest_baseline(results[3:5]) is None
    assert fastest_result([row("lru:fcfs", NAN)]) is None


def test_the_full_ladder_splits_the_gain_in_four_parts_that_multiply_to_the_total():
    gains = gain_decomposition(rows(*LADDER))
    assert gains == GainDecomposition(
        reference="lru:fcfs",
        target="pbkv:workflow",
        total_speedup=2.0,
        parts=(
            GainPart("batching", "lru:fcfs", "lru:fcfs-balanced", 1.25),
            GainPart("admission", "lru:fcfs-balanced", "lru:workflow", 1.2),
            GainPart("eviction", "lru:workflow", "he:workflow", 1.25),
            GainPart("prefetch", "he:workflow", "pbkv:workflow", 128.0 / 120.0),
        ),
        asides=(),
        strongest_baseline="he:workflow",
        fastest="pbkv:workflow",
    )
    assert math.prod(p.speedup for p in gains.parts) == pytest.approx(2.0, rel=1e-12)


def test_without_he_the_cache_policy_is_one_part_that_names_the_row_to_split_it():
    gains = gain_decomposition(
        rows("lru:fcfs", "lru:fcfs-balanced", "lru:workflow", "pbkv:workflow")
    )
    assert gains.parts == (
        GainPart("batching", "lru:fcfs", "lru:fcfs-balanced", 1.25),
        GainPart("admission", "lru:fcfs-balanced", "lru:workflow", 1.2),
        GainPart("cache policy", "lru:workflow", "pbkv:workflow", 160.0 / 120.0, ("he:workflow",)),
    )
    assert (gains.total_speedup, gains.strongest_baseline) == (2.0, "lru:workflow")


def test_a_missing_middle_row_joins_the_parts_beside_it():
    gains = gain_decomposition(rows("pbkv:workflow", "lru:fcfs", "he:workflow"))
    assert gains.parts == (
        GainPart(
            "batching + admission + eviction",
            "lru:fcfs",
            "he:workflow",
            240.0 / 128.0,
            ("lru:fcfs-balanced", "lru:workflow"),
        ),
        GainPart("prefetch", "he:workflow", "pbkv:workflow", 128.0 / 120.0),
    )
    assert gains.total_speedup == 2.0


def test_parts_outside_the_rows_that_ran_are_not_measured_and_name_what_they_need():
    gains = gain_decomposition(rows("lru:fcfs-balanced", "lru:workflow"))
    assert gains.parts == (
        GainPart("batching", "lru:fcfs", "lru:fcfs-balanced", None, ("lru:fcfs",)),
        GainPart("admission", "lru:fcfs-balanced", "lru:workflow", 1.2),
        GainPart("cache policy", "lru:workflow", "pbkv:workflow", None, ("pbkv:workflow",)),
    )
    assert gains.total_speedup is None
    none_ran = gain_decomposition([row("trtllm-default:fcfs", 10.0)])
    assert [p.speedup for p in none_ran.parts] == [None, None, None]
    assert none_ran.parts[2].missing == ("lru:workflow", "pbkv:workflow")


def test_fcfs_rows_of_the_cache_policies_are_asides():
    results = [row("lru:fcfs", 240.0), row("he:fcfs", 200.0), row("pbkv:fcfs", 192.0)]
    gains = gain_decomposition(results)
    assert gains.asides == (
        GainPart("eviction on fcfs", "lru:fcfs", "he:fcfs", 1.2),
        GainPart("cache policy on fcfs", "lru:fcfs", "pbkv:fcfs", 1.25),
    )


def test_won_says_by_how_much_over_the_strongest_baseline_and_lru():
    assert won_text(rows(*LADDER)) == (
        "won: pbkv:workflow (120.00 s): 1.067x over the strongest baseline, he:workflow; "
        "2.000x over lru:fcfs"
    )
    baseline_won = [row("lru:fcfs", 100.0), row("pbkv:workflow", 125.0)]
    assert won_text(baseline_won) == (
        "won: lru:fcfs (100.00 s), a baseline; the best pbkv row, pbkv:workflow: 0.800x"
    )
    assert won_text([row("pbkv:workflow", 10.0)]) == (
        "won: pbkv:workflow (10.00 s); no baseline row to compare with"
    )


def test_the_table_shows_both_speedups_host_hits_the_gain_by_part_and_bounds_apart():
    text = render(comparison_table(rows(*LADDER), "codegen", bounds=BOUNDS))
    lines = [line.rstrip() for line in text.splitlines()]
    assert max(map(len, lines)) <= TABLE_WIDTH
    assert lines[1:10] == POLICY_ROWS.splitlines()
    gains = lines.index("the gain over lru:fcfs, by part (latency ratios)")
    assert lines[gains + 3 : gains + 8] == GAIN_ROWS.splitlines()
    bounds = lines.index("bounds, not policies: what no row beats on this workload")
    assert bounds > gains and "ceiling" not in "\n".join(lines[:bounds])
    starts = ("ceiling", "MIN", "floor", "uncontested")
    bound_rows = [line.split() for line in lines[bounds:] if line.startswith(starts)]
    assert [words[:6] for words in bound_rows] == [
        ["ceiling", "total", "hit%", "90.0", "1.200x", "1.200x"],
        ["MIN", "GPU", "hit%", "80.0", "1.600x", "1.600x"],
        ["MIN", "total", "hit%", "90.0", "1.200x", "1.200x"],
        ["floor", "mean", "lat", "s", "100.00", "2.400x"],
        ["uncontested", "mean", "lat", "s", "150.00", "1.600x"],
    ]
    assert [words[6] for words in bound_rows[3:]] == ["1.200x", "0.800x"]  # pbkv:workflow's


def test_long_names_retractions_and_big_numbers_still_fit_100_columns():
    results = [
        row("lru:fcfs", 1234.56),
        row("pbkv-aggressive:workflow-retract", 1057.68, retractions=12_345),
        dataclasses.replace(row("lru:fcfs-balanced", 999.99), recomputed_tokens=12_345_678),
    ]
    text = render(comparison_table(results, "a long title " * 12, bounds=BOUNDS))
    assert max(len(line.rstrip()) for line in text.splitlines()) <= TABLE_WIDTH
    assert "retracted" in text and "12,345" in text and "12,345,678" in text
    assert "retracted" not in render(comparison_table(rows(*LADDER), "t"))


def test_without_ladder_rows_the_report_says_which_rows_it_needs():
    text = " ".join(render(comparison_table([row("trtllm-default:fcfs", 10.0)], "t")).split())
    assert (
        "won: trtllm-default:fcfs (10.00 s), a baseline; no pbkv row gain by part: needs the "
        "rows lru:fcfs, lru:fcfs-balanced, lru:workflow and pbkv:workflow (he:workflow splits "
        "the cache policy)"
    ) in text
    two = render(comparison_table(rows("lru:fcfs", "pbkv:workflow"), "t")).splitlines()
    part = next(i for i, line in enumerate(two) if line.startswith("batching"))
    assert [line.rstrip() for line in two[part:]] == JOINED_PART.splitlines()
    unmeasured = render(comparison_table(rows("lru:workflow", "pbkv:workflow"), "t"))
    assert "batching n/a lru:fcfs -> lru:fcfs-balanced not measured: needs lru:fcfs," in (
        " ".join(unmeasured.split())
    )


def test_speedups_without_a_measured_latency_read_n_a():
    cold = [row("lru:fcfs", NAN, gpu=0.0, host=0.0), row("lae:fcfs", NAN, gpu=0.0, host=0.0)]
    text = render(comparison_table(cold, "cold", bounds=BOUNDS))
    assert "nanx" not in text
    # a row's mean and p99 latency and its 2 speedups; lru's headroom under 5 bounds;
    # each row's p50 and max latency in the tail line
    assert text.count("n/a") == 2 * 4 + 5 + 2 * 2
    assert ratio_text(3.0, 2.0) == "1.500x" and ratio_text(1.0, 0.0) == "n/a"


def test_the_json_carries_the_decomposition(tmp_path):
    path = tmp_path / "bench.json"
    write_json(path, BenchConfig(), 1000, rows("lru:fcfs", "lru:workflow", "pbkv:workflow"))
    decomposition = json.loads(path.read_text())["decomposition"]
    assert decomposition == {
        "reference": "lru:fcfs",
        "target": "pbkv:workflow",
        "total_speedup": 2.0,
        "parts": [
            {
                "name": "batching + admission",
                "from_row": "lru:fcfs",
                "to_row": "lru:workflow",
                "speedup": 1.5,
                "missing": ["lru:fcfs-balanced"],
            },
            {
                "name": "cache policy",
                "from_row": "lru:workflow",
                "to_row": "pbkv:workflow",
                "speedup": 160.0 / 120.0,
                "missing": ["he:workflow"],
            },
        ],
        "asides": [],
        "strongest_baseline": "lru:workflow",
        "fastest": "pbkv:workflow",
    }


def test_the_sweep_shows_both_speedups_and_its_bounds_apart_within_100_columns(tmp_path):
    from pbkv.bench.report import sweep_table, write_sweep_json
    from pbkv.bench.sweeps import SweepPoint

    points = [SweepPoint("concurrency", c, 1000, tuple(rows(*LADDER)), BOUNDS) for c in (2.0, 32.0)]
    lines = [line.rstrip() for line in render(sweep_table(points, "sweep")).splitlines()]
    assert max(map(len, lines)) <= TABLE_WIDTH
    assert lines[4].split() == [
        "2", "lru:fcfs", "240.00", "0.500", "50.0", "25.0", "1.000x", "0.533x", "1.000x", "0.0",
    ]  # fmt: skip
    assert lines[8].split()[:7] == [
        "pbkv:workflow", "120.00", "0.500", "50.0", "25.0", "2.000x", "1.067x",
    ]  # fmt: skip
    bounds = lines.index("bounds, not policies: what no row beats at each value")
    assert "MIN" not in "\n".join(lines[:bounds])
    assert [line.split() for line in lines[bounds + 4 :]] == [
        ["2", "80.0", "90.0", "100.00", "2.400x", "lru:fcfs", "1.200x", "pbkv:workflow"],
        ["32", "80.0", "90.0", "100.00", "2.400x", "lru:fcfs", "1.200x", "pbkv:workflow"],
    ]
    write_sweep_json(tmp_path / "sweep.json", BenchConfig(), points)
    payload = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["decomposition"]["total_speedup"] for p in payload["points"]] == [2.0, 2.0]
    assert [part["speedup"] for part in payload["points"][0]["decomposition"]["parts"]] == [
        1.25, 1.2, 1.25, 128.0 / 120.0,
    ]  # fmt: skip
