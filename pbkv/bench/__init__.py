"""Benchmarks: policy comparisons on one workload (``pbkv bench``) and micro-benchmarks."""

from pbkv.bench.compare import compare_policies
from pbkv.bench.config import BenchConfig
from pbkv.bench.results import PolicyResult
from pbkv.bench.row import run_policy

__all__ = ["BenchConfig", "PolicyResult", "compare_policies", "run_policy"]
