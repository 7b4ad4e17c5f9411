"""Builders shared by the actor tests: tiny hand-made workflows and a sim engine."""

import trio

from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.engine import SimConfig, SimEngine
from pbkv.engines.sim.profile import load_hardware, load_model
from pbkv.kvmanager import KVConfig, KVManager

AGENTS = ("planner", "coder", "tester")
BS = 16
PREAMBLE = tuple(range(1_000, 1_032))  # 32 tokens shared by every agent
ROLES = {a: tuple(range(2_000 + 100 * i, 2_016 + 100 * i)) for i, a in enumerate(AGENTS)}
COST = CostModel(load_hardware("a6000-tp2"), load_model("qwen3-32b"))


def make_workflow(i: int, agents: tuple[str, ...], *, gap_s: float = 0.0) -> Workflow:
    """Workflow ``wf{i}``: preamble + role + a context that grows by each step's output."""
    context = tuple(range(10_000 + 1_000 * i, 10_020 + 1_000 * i))
    steps = []
    for s, agent in enumerate(agents):
        output = tuple(range(50_000 + 100 * i + 10 * s, 50_004 + 100 * i + 10 * s))
        segments = (
            Segment("preamble", PREAMBLE),
            Segment("role", ROLES[agent]),
            Segment("context", context),
        )
        steps.append(Step(agent, segments, output, gap_s=gap_s))
        context += output
    return Workflow(f"wf{i}", "demo", f"task{i}", f"task text {i}", tuple(steps))


def make_kv(policy: str = "pbkv", *, gpu_blocks: int = 64, host_blocks: int = 64) -> KVManager:
    return KVManager(
        KVConfig(
            block_size=BS,
            gpu_capacity_blocks=gpu_blocks,
            host_capacity_blocks=host_blocks,
            bytes_per_block=COST.kv_bytes_per_token * BS,
            policy=policy,
            bandwidth_bytes_per_s=COST.bandwidth_bytes_per_s,
        ),
        trio.current_time,
    )


def make_engine(kv: KVManager) -> SimEngine:
    return SimEngine(kv, COST, SimConfig(check_integrity=True))
