"""Micro-benchmarks: ``python -m pbkv.bench.micro`` prints one table.

Measures, on this machine's wall clock: actor ``tell`` throughput, ``ask`` round trip,
the score refresh cost per touched node (paper: 1.53 µs vs a 12.34 ms decode step), the
GPU eviction cost per evicted node, and simulated requests served per wall-clock second.
Numbers are for comparison on one machine, not assertions.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import trio
from rich.console import Console
from rich.table import Table

from pbkv.kvmanager import AdmitRequest, KVConfig, KVManager
from pbkv.runtime import Actor, open_actor_system

AGENTS = ("planner", "coder", "tester", "analyzer")


class _Counter(Actor):
    def __init__(self) -> None:
        super().__init__(mailbox_capacity=1024)
        self.count = 0

    async def handle(self, msg: object) -> int:
        self.count += 1
        return self.count


def tell_throughput(n: int = 50_000) -> float:
    """Return messages per second through ``tell`` to one actor (producer + consumer)."""

    async def main() -> float:
        async with open_actor_system() as system:
            actor = _Counter()
            ref = await system.spawn(actor, name="counter")
            started = time.perf_counter()
            for i in range(n):
                await ref.tell(i)
            await ref.ask("flush")
            return n / (time.perf_counter() - started)

    return trio.run(main)


def ask_round_trip_us(n: int = 10_000) -> float:
    """Return the mean ``ask`` round trip in microseconds."""

    async def main() -> float:
        async with open_actor_system() as system:
            ref = await system.spawn(_Counter(), name="counter")
            started = time.perf_counter()
            for i in range(n):
                await ref.ask(i)
            return 1e6 * (time.perf_counter() - started) / n

    return trio.run(main)


def _populated_manager(workflows: int, steps: int, policy: str = "pbkv") -> KVManager:
    clock = iter(range(10**9))
    kv = KVManager(
        KVConfig(block_size=16, gpu_capacity_blocks=100_000, host_capacity_blocks=0, policy=policy),
        lambda: float(next(clock)),
    )
    rng = np.random.default_rng(0)
    preamble = list(range(1, 101))
    for w in range(workflows):
        wid = f"w{w}"
        kv.on_workflow_started(wid)
        context = preamble + [10_000 + w]
        for s in range(steps):
            agent = AGENTS[s % len(AGENTS)]
            context = context + [int(x) for x in rng.integers(20_000, 30_000, 20)]
            adm = kv.try_admit(AdmitRequest(context, 16 * len(context), 16, wid, agent))
            assert adm is not None
            kv.commit(adm, context)
            kv.release(adm)
    return kv


def score_refresh_us_per_node(workflows: int = 64, steps: int = 8, rounds: int = 200) -> float:
    """Return the wall time of one incremental score refresh divided by the nodes it touched."""
    kv = _populated_manager(workflows, steps)
    rng = np.random.default_rng(1)
    forecasts = rng.dirichlet(np.ones(len(AGENTS) + 1), size=(rounds, 3))
    touched = 0
    started = time.perf_counter()
    for r in range(rounds):
        touched += kv.on_forecast(f"w{r % workflows}", forecasts[r], AGENTS)
    return 1e6 * (time.perf_counter() - started) / max(1, touched)


def eviction_us_per_node(workflows: int = 64, steps: int = 8) -> float:
    """Return the wall time per evicted node when emptying a populated GPU tier."""
    kv = _populated_manager(workflows, steps)
    nodes = len(kv.tree.nodes())
    started = time.perf_counter()
    kv.tree.evict("gpu", kv.tree.cached_blocks("gpu"))
    return 1e6 * (time.perf_counter() - started) / nodes


def simulated_requests_per_s(app: str = "codegen", workflows: int = 32) -> float:
    """Return invocations the virtual-time engine serves per wall-clock second (pbkv)."""
    from pbkv.bench.compare import BenchConfig, compare_policies

    config = BenchConfig(
        app=app, policies=("pbkv",), workflows=workflows, concurrency=8, train_workflows=100
    )
    results, _ = compare_policies(config)
    return results[0].kv.requests / results[0].wall_s


def main() -> None:
    import argparse

    argparse.ArgumentParser(prog="python -m pbkv.bench.micro", description=__doc__).parse_args()
    rows: list[tuple[str, Callable[[], float], str]] = [
        ("actor tell throughput", tell_throughput, "msgs/s"),
        ("actor ask round trip", ask_round_trip_us, "µs"),
        ("score refresh per touched node", score_refresh_us_per_node, "µs"),
        ("GPU eviction per node", eviction_us_per_node, "µs"),
        ("simulated requests per wall second (codegen, pbkv)", simulated_requests_per_s, "req/s"),
    ]
    table = Table(title="pbkv micro-benchmarks (wall clock, this machine)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("unit")
    for name, fn, unit in rows:
        table.add_row(name, f"{fn():,.2f}", unit)
    Console(width=100).print(table)


if __name__ == "__main__":
    main()
