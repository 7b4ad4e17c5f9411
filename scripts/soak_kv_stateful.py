"""Soak the KV manager's stateful property test: run its state machine until at least
``--steps`` steps have been checked, and report steps, examples and violations.

The machine is ``tests/kvmanager/test_radix_stateful.py``'s ``KVManagerMachine``
(admissions, loads, commits, releases, invocations, forecasts, prefetches, evictions,
with every §5.1 invariant and every node's score checked against the reference score
model, the tail past the horizon included). It runs in chunks of ``--chunk-examples``
examples of up to ``--steps-per-example`` steps, each chunk with fresh random seeds
and no example database; a violation (a failed invariant or rule, shrunk by
Hypothesis) is counted and printed, and the soak goes on. Not a default test: pytest
runs the same machine briefly (60 examples).

Usage: ``python scripts/soak_kv_stateful.py [--steps 1000000] [--json soak.json]``;
exit status 1 if any violation was found.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/

from tests.kvmanager import test_radix_stateful as stateful  # noqa: E402


class CountedMachine(stateful.KVManagerMachine):
    """The machine, counting the examples it finishes."""

    examples = 0

    def teardown(self) -> None:
        type(self).examples += 1
        super().teardown()


def soak(target_steps: int, chunk_examples: int, steps_per_example: int) -> dict[str, object]:
    """Run chunks until ``target_steps`` steps were checked; return the figures.

    A step is one rule (the setup included) after which every invariant was checked
    (the machine's ``STEPS_RUN`` counter).
    """
    chunk_settings = settings(
        max_examples=chunk_examples,
        stateful_step_count=steps_per_example,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    violations: list[str] = []
    chunks = 0
    started_s = time.perf_counter()
    first_step, first_example = stateful.STEPS_RUN[0], CountedMachine.examples
    while stateful.STEPS_RUN[0] - first_step < target_steps:
        chunks += 1
        try:
            run_state_machine_as_test(CountedMachine, settings=chunk_settings)
        except Exception as error:  # a violation: count it, show it, go on
            violations.append("".join(traceback.format_exception(error))[-4000:])
            print(f"VIOLATION in chunk {chunks}:\n{violations[-1]}", flush=True)
        elapsed_s = time.perf_counter() - started_s
        steps = stateful.STEPS_RUN[0] - first_step
        examples = CountedMachine.examples - first_example
        print(
            f"chunk {chunks}: {steps:,} steps, {examples:,} examples, "
            f"{len(violations)} violations, {elapsed_s:.0f} s",
            flush=True,
        )
    return {
        "steps": stateful.STEPS_RUN[0] - first_step,
        "examples": CountedMachine.examples - first_example,
        "chunks": chunks,
        "violations": len(violations),
        "violation_reports": violations,
        "elapsed_s": round(time.perf_counter() - started_s, 1),
        "chunk_examples": chunk_examples,
        "steps_per_example": steps_per_example,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="steps to check, at least")
    parser.add_argument("--chunk-examples", type=int, default=1000, help="examples per chunk")
    parser.add_argument(
        "--steps-per-example", type=int, default=100, help="most steps an example runs"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.chunk_examples < 1 or args.steps_per_example < 1:
        parser.error("--steps, --chunk-examples and --steps-per-example must be >= 1")
    figures = soak(args.steps, args.chunk_examples, args.steps_per_example)
    print(
        f"soak: {figures['steps']:,} steps in {figures['examples']:,} examples, "
        f"{figures['violations']} violations, {figures['elapsed_s']} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if figures["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
