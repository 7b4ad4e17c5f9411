"""The stale-context input of issue 28: one agent whose prompt is rewritten near its top
at every step (a plan-and-execute re-planner) over ~1,200 tokens of notes. Its previous
step's context is dead while the agent keeps running; pbkv must not keep it at live
context's expense, and so must not fall below lru:workflow."""

import random

import pytest

from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.bench.compare import BenchConfig, gpu_tokens_for, run_policy
from pbkv.kvmanager.scoring import ScoreBoard

EDGES = (("executor", "executor"), ("executor", "END"))


def replanner(n: int, seed: int = 0) -> list[Workflow]:
    rng = random.Random(seed)

    def tokens(k: int) -> tuple[int, ...]:
        return tuple(rng.randrange(100, 49_000) for _ in range(k))

    preamble, role = tokens(200), tokens(50)
    workload = []
    for w in range(n):
        notes, steps = tokens(1200), []
        for _ in range(rng.choice((4, 5))):
            context, first = tokens(20) + notes, tokens(100)  # the plan line on top
            for prompt in (context, context + first + tokens(30)):
                segments = (Segment("preamble", preamble), Segment("role", role))
                steps.append(
                    Step("executor", (*segments, Segment("context", prompt)), tokens(100), 1.0)
                )
        workload.append(Workflow(f"replan-{w}", "replan", f"t{w}", "", tuple(steps)))
    return workload


def latency(workload, policy: str, concurrency: int) -> float:
    config = BenchConfig(app="replan", workflows=len(workload), concurrency=concurrency)
    return run_policy(
        workload,
        config,
        policy,
        [],
        gpu_kv_tokens=gpu_tokens_for(workload, concurrency),
        step_graph_edges=EDGES,
        app_agents=("executor",),
    ).mean_latency_s


@pytest.fixture(scope="module")
def workload():
    return replanner(64)


def test_pbkv_is_not_below_lru_workflow_on_a_replanner(workload):
    assert latency(workload, "lru:workflow", 32) / latency(workload, "pbkv", 32) >= 0.99


def test_without_leaving_the_old_branch_pbkv_falls_below(workload, monkeypatch):
    """The rule is what holds it: with the old branch kept, pbkv falls below lru:workflow
    at c=32 (the issue's case)."""
    monkeypatch.setattr(ScoreBoard, "leave_branch", lambda self, *args: 0)
    assert latency(workload, "lru:workflow", 32) / latency(workload, "pbkv", 32) < 0.99
