"""Policy comparison on generated workloads: determinism and the order of hit rates (§9)."""

import dataclasses
import json

import pytest

from pbkv.bench.compare import BenchConfig, compare_policies
from pbkv.cli import main

SMALL = BenchConfig(
    app="codegen",
    policies=("lru", "lae", "he", "pbkv"),
    workflows=32,
    concurrency=8,
    predictor="markov",
    train_workflows=100,
    seed=0,
)


def figures(results):
    return [
        (r.policy, r.mean_latency_s, r.p99_latency_s, r.mean_ttft_s, r.gpu_hit_rate, r.kv)
        for r in results
    ]


@pytest.fixture(scope="module")
def codegen_markov():
    return compare_policies(SMALL)


def test_same_seed_same_figures(codegen_markov):
    again, gpu_tokens = compare_policies(SMALL)
    assert figures(again) == figures(codegen_markov[0])
    assert gpu_tokens == codegen_markov[1]


def test_different_seed_different_workload(codegen_markov):
    other, _ = compare_policies(dataclasses.replace(SMALL, seed=1, policies=("lru",)))
    assert other[0].kv.prompt_tokens != codegen_markov[0][0].kv.prompt_tokens


def test_codegen_under_pressure_orders_hit_rates(codegen_markov):
    results, gpu_tokens = codegen_markov
    hit = {r.policy: r.gpu_hit_rate for r in results}
    assert hit["lru"] < hit["lae"] <= hit["he"] <= hit["pbkv"]
    # the GPU tier really was under pressure: active cache had to be evicted under lru
    assert results[0].kv.evicted_active_blocks > 0
    assert gpu_tokens < SMALL.concurrency * 10_000
    oracle, _ = compare_policies(dataclasses.replace(SMALL, predictor="oracle", policies=("pbkv",)))
    assert oracle[0].gpu_hit_rate >= hit["pbkv"]


def test_every_workflow_completes_and_cache_is_released(codegen_markov):
    for r in codegen_markov[0]:
        assert r.workflows == SMALL.workflows
        assert r.kv.requests > SMALL.workflows
        assert 0.0 < r.gpu_hit_rate < 1.0
        assert r.kv.cached_gpu_tokens + r.kv.cached_host_tokens <= r.kv.prompt_tokens


def test_cli_bench_prints_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--app",
            "codegen",
            "--workflows",
            "4",
            "--concurrency",
            "2",
            "--policies",
            "lru,pbkv",
            "--train-workflows",
            "20",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "hit%" in text and "pbkv:workflow" in text and "lru:fcfs" in text
    payload = json.loads(out.read_text())
    assert [r["policy"] for r in payload["results"]] == ["lru", "pbkv"]
    assert [r["scheduler"] for r in payload["results"]] == ["fcfs", "workflow"]
    row = payload["results"][0]
    assert row["total_hit_rate"] == pytest.approx(row["gpu_hit_rate"] + row["host_hit_rate"])
    assert {"ceiling_hit_rate", "floor_latency_s", "min_hit_rate"} <= set(payload["bounds"])
    assert payload["bounds"]["ceiling_hit_rate"] >= row["total_hit_rate"]
    assert payload["gpu_kv_capped"] is False
    assert "GPU KV tier" in text and "ceiling" in text
    assert payload["config"]["workflows"] == 4
    # the simulation cost of each row, beside lru's, from the same run
    cost = next(line for line in text.splitlines() if line.startswith("simulation CPU"))
    lru_s, pbkv_s = (r["cpu_s"] for r in payload["results"])
    assert f"lru:fcfs {lru_s:.2f} s (1.000x)" in cost
    assert f"pbkv:workflow {pbkv_s:.2f} s ({pbkv_s / lru_s:.3f}x)" in cost


def test_cli_rejects_unknown_names(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--policies", "lru,nope"])
    assert "known: lru, lae, he, pbkv" in capsys.readouterr().err
    assert main(["bench", "--app", "nope", "--workflows", "2"]) == 2
    assert "known apps" in capsys.readouterr().err
    for policies, said in [("lru,,pbkv", "an empty entry"), ("lru,pbkv,lru", "lru listed more")]:
        with pytest.raises(SystemExit):
            main(["bench", "--policies", policies])
        assert said in capsys.readouterr().err


class _EmptyPromptApp:
    """codegen, with the second step of every workflow given an empty prompt."""

    def __init__(self):
        from pbkv.examples import get_app

        self._app = get_app("codegen")
        self.name, self.agents, self.edges = self._app.name, self._app.agents, self._app.edges
        self.entry_agents = self._app.entry_agents

    def generate(self, n, seed):
        def empty(w):
            steps = list(w.steps)
            steps[1] = dataclasses.replace(steps[1], segments=())
            return dataclasses.replace(w, steps=tuple(steps))

        return [empty(w) for w in self._app.generate(n, seed)]


def test_an_app_step_with_an_empty_prompt_is_named(capsys):
    assert main(["bench", "--app", f"{__name__}:_EmptyPromptApp", "--workflows", "2"]) == 2
    err = capsys.readouterr().err
    assert "workflow 'codegen-0-0' step 1 (agent" in err and "empty prompt" in err


def test_a_table_over_no_measured_workflow_says_n_a():
    from pbkv.bench.report import figure_text, ratio_text

    nan = float("nan")
    assert (figure_text(nan), ratio_text(nan, 2.0), ratio_text(2.0, nan)) == ("n/a",) * 3
    assert (figure_text(1.005, 1), ratio_text(1.0, 4.0)) == ("1.0", "0.250x")


def test_open_loop_without_arrival_times_is_warned_about(caplog):
    from pbkv.bench.compare import run_bench

    config = dataclasses.replace(SMALL, workflows=2, concurrency=2, policies=("lru",))
    run_bench(dataclasses.replace(config, open_loop=True), bounds=False)
    assert "gives every workflow arrival time 0" in caplog.text


def test_graphsage_predictor_runs_in_the_bench_with_markov_fallback():
    from pbkv.bench.compare import build_forecasters
    from pbkv.examples import get_app

    config = dataclasses.replace(
        SMALL,
        workflows=6,
        concurrency=2,
        train_workflows=40,
        predictor="graphsage",
        policies=("pbkv",),
    )
    app = get_app("codegen")
    chain = build_forecasters(
        config, app.agents, app.edges, app.generate(6, 0), app.generate(40, 1)
    )
    assert [f.name for f in chain] == ["graphsage", "markov-1"]
    results, _ = compare_policies(config)
    assert results[0].predictor == "graphsage" and results[0].kv.score_refreshed_nodes > 0


def test_same_seed_same_figures_in_separate_processes(tmp_path):
    """Memory addresses and string hashes differ between processes; the figures must
    not. (τ-bench's tool latencies make agents wake at the same virtual instant, which
    trio orders by ``id()`` unless deterministic scheduling is on.)"""
    import json
    import os
    import subprocess
    import sys

    runs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}.json"
        args = "--app taubench --workflows 40 --concurrency 16 --policies pbkv"
        subprocess.run(
            [sys.executable, "-m", "pbkv.cli", "bench", *args.split(), "--json", str(out)],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        results = json.loads(out.read_text())["results"]
        runs.append([{k: v for k, v in r.items() if k not in ("wall_s", "cpu_s")} for r in results])
    assert runs[0] == runs[1]


def test_seed_scheduler_turns_on_trios_deterministic_scheduling():
    import trio._core._run as trio_run

    from pbkv.runtime import seed_scheduler

    seed_scheduler(3)
    assert trio_run._ALLOW_DETERMINISTIC_SCHEDULING is True
    first = trio_run._r.random()
    seed_scheduler(3)
    assert trio_run._r.random() == first


USER_APP = '''
import pbkv.live as live

def make():
    """Writer -> Critic; a REVISE verdict loops back, at most twice (then recursion_limit)."""
    app = live.App("essay", preamble="You write essays as a team.")
    app.agent("writer", role="Write.", max_new_tokens=120, max_visits=3,
              simulate=lambda s: live.Simulated(output_tokens=100, gap_s=0.1))
    app.agent("critic", role="Say ACCEPT or REVISE.", max_new_tokens=20,
              simulate=lambda s: live.Simulated(text="REVISE", output_tokens=10))
    app.edge(live.START, "writer").edge("writer", "critic")
    app.route("critic", lambda s, out: "writer" if "REVISE" in out.text else live.END,
              ["writer", live.END])
    return app

app = make()
'''


def test_cli_bench_runs_a_user_app_and_counts_end_reasons(tmp_path, monkeypatch, capsys):
    (tmp_path / "user_essay.py").write_text(USER_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "bench.json"
    argv = ["bench", "--app", "user_essay:app", "--workflows", "3", "--concurrency", "2"]
    assert (
        main([*argv, "--policies", "lru,pbkv", "--train-workflows", "5", "--json", str(out)]) == 0
    )
    assert "0/3/0/0" in capsys.readouterr().out  # every essay is revised until the cap
    results = json.loads(out.read_text())["results"]
    for r in results:
        assert r["end_reasons"] == {"end": 0, "recursion_limit": 3, "error": 0, "aborted": 0}
        assert r["mean_latency_s"] > 0  # capped workflows ran to their end: they count


def test_bounds_bound_every_policy_on_its_own_access_order():
    from pbkv.bench.compare import run_bench
    from pbkv.kvmanager import get_policy

    specs = ("lru", "he", "pbkv", "belady-est", "lru:workflow", "he:lpm")
    config = dataclasses.replace(SMALL, workflows=16, concurrency=8, policies=specs)
    run = run_bench(config)
    b = run.bounds
    assert [f"{r.policy}:{r.scheduler}" for r in run.results] == [
        "lru:fcfs", "he:fcfs", "pbkv:workflow", "belady-est:fcfs", "lru:workflow", "he:lpm",
    ]  # fmt: skip
    assert b.min_order == "lru:fcfs"
    for r in run.results:
        assert r.ceiling_hit_rate == b.ceiling_hit_rate  # the same requests in any order
        assert r.total_hit_rate <= b.ceiling_hit_rate
        assert r.mean_latency_s >= b.floor_latency_s
        if get_policy(r.policy).prefetch == "none":  # MIN bounds demand caching
            assert r.min_gpu_hit_rate >= r.gpu_hit_rate
            assert r.min_total_hit_rate >= r.total_hit_rate
    lru = run.results[0]
    assert lru.gpu_hit_rate < b.min_hit_rate <= b.ceiling_hit_rate  # contested; MIN is above
    assert run.results[0].kv.evicted_active_blocks > 0


def test_policy_specs_name_their_scheduler_or_take_the_default():
    import argparse

    from pbkv.bench.compare import resolve_spec
    from pbkv.cli.arguments import policy_specs

    assert resolve_spec("lru") == ("lru", "fcfs")
    assert resolve_spec("pbkv") == ("pbkv", "workflow")
    assert resolve_spec("pbkv", "lpm") == ("pbkv", "lpm")
    assert resolve_spec("lru:workflow", "fcfs") == ("lru", "workflow")  # the spec wins
    with pytest.raises(ValueError, match="known: fcfs, lpm, workflow"):
        resolve_spec("lru:sjf")
    with pytest.raises(ValueError, match="unknown policy 'belady'"):
        resolve_spec("belady")  # renamed: it is an estimate, not a bound
    assert policy_specs("lru,lru:workflow") == ("lru", "lru:workflow")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown scheduler in lru:sjf"):
        policy_specs("lru:sjf")


def test_the_schedulers_shortcuts_leave_every_figure_as_trying_each_request_does(monkeypatch):
    """Refusing held requests from the queue's index, not repeating a call that changed
    nothing, and syncing the index only when the queue changed are exact: on a contested
    hover load every request is admitted in the same step, with the same hits, as when
    each queued request goes through ``try_admit``'s full path on every step."""
    from pbkv.bench.report import result_record
    from pbkv.engines import ranked, workflow_scheduler
    from pbkv.kvmanager import KVManager

    config = BenchConfig(
        app="hover",
        policies=("pbkv",),
        workflows=8,
        concurrency=6,
        gpu_kv_tokens=9000,
        train_workflows=20,
    )

    def rows() -> list[dict]:
        results, _ = compare_policies(config)
        return [{k: v for k, v in result_record(r).items() if k not in ("wall_s", "cpu_s")}
                for r in results]  # fmt: skip

    fast = rows()
    assert fast[0]["kv"].rejected_admissions > 1000  # held requests retried step after step
    with monkeypatch.context() as m:
        m.setattr(KVManager, "_refused_as_is", lambda *a: False)
        m.setattr(KVManager, "refusals", lambda self, requests, retired_only=False: set())
        m.setattr(ranked._Quiet, "same_as", lambda self, other: False)
        for module in (ranked, workflow_scheduler):  # every cache and skip misses
            m.setattr(module, "_same", lambda a, b: False)
        slow = rows()
    assert fast == slow


@pytest.mark.parametrize(
    ("app", "workflows", "concurrency", "gpu_kv_tokens"),
    [("hover", 8, 6, 9000), ("financebench", 6, 4, 12000)],
)
def test_a_quiet_call_skipped_across_chunk_commits_leaves_every_figure(
    monkeypatch, app, workflows, concurrency, gpu_kv_tokens
):
    """The workflow scheduler skips an admission call that would repeat the last quiet
    one while only settled chunk commits changed the tree (``KVManager.settled_version``):
    on contested loads (lru and pbkv on balanced batches) every row's figures are those
    of the path that runs every call in full, and the skip fires across commits."""
    from pbkv.bench.report import result_record
    from pbkv.engines import ranked

    config = BenchConfig(
        app=app,
        policies=("pbkv", "lru:workflow"),
        workflows=workflows,
        concurrency=concurrency,
        gpu_kv_tokens=gpu_kv_tokens,
        train_workflows=20,
        predictor="markov",
        host_tier="exclusive",  # the load whose skip count was measured (> 1000 across)
    )

    def rows() -> list[dict]:
        results, _ = compare_policies(config)
        return [{k: v for k, v in result_record(r).items() if k not in ("wall_s", "cpu_s")}
                for r in results]  # fmt: skip

    same_as = ranked._Quiet.same_as
    across = 0

    def counted(self, other):
        nonlocal across
        hit = same_as(self, other)
        across += hit and other.tree_version != self.tree_version  # commits in between
        return hit

    with monkeypatch.context() as m:
        m.setattr(ranked._Quiet, "same_as", counted)
        fast = rows()
    assert across > 1000, across
    with monkeypatch.context() as m:
        m.setattr(ranked._Quiet, "same_as", lambda self, other: False)
        slow = rows()
    assert fast == slow
