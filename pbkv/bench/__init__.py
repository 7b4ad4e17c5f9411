"""Benchmarks: policy comparisons on one workload (``pbkv bench``) and micro-benchmarks."""

from pbkv.bench.compare import BenchConfig, PolicyResult, compare_policies, run_policy

__all__ = ["BenchConfig", "PolicyResult", "compare_policies", "run_policy"]
