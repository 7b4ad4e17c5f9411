"""The workload options of ``pbkv bench``, ``sweep`` and ``trace-plot``, and the
:class:`~pbkv.bench.config.BenchConfig` they make."""

from __future__ import annotations

import argparse

from pbkv.cli.arguments import APP_HELP, policy_specs, positive_int
from pbkv.examples.gaps import GAP_MODELS


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """Add the workload, tier and predictor options (defaults: :class:`BenchConfig`'s)."""
    from pbkv.bench.config import BenchConfig
    from pbkv.engines.scheduler import SCHEDULERS

    d = BenchConfig()
    p.add_argument("--app", default=d.app, help=APP_HELP)
    p.add_argument(
        "--policies",
        type=policy_specs,
        default=",".join(d.policies),
        help="comma-separated policies (also lae, he, kvflow, belady-est, pbkv-aggressive, "
        "and the 2025-26 baselines continuum, autellix, markov-survival); name:scheduler "
        "picks a row's scheduler, e.g. lru:workflow",
    )
    p.add_argument(
        "--scheduler",
        choices=tuple(SCHEDULERS),
        default=None,
        help="admission scheduler for every policy not naming one (default: pbkv and "
        "pbkv-aggressive run workflow, the others fcfs); workflow-retract also pauses "
        "younger workflows' running requests for the one that must go next; "
        "fcfs-balanced is fcfs with workflow's stall-free batches",
    )
    p.add_argument(
        "--workflows", type=positive_int, default=d.workflows, help="workflows in the workload"
    )
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=d.concurrency,
        help="workflows in flight at once",
    )
    p.add_argument(
        "--open-loop",
        action="store_true",
        help="start each workflow at its arrival time (concurrency still caps those in "
        "flight); mooncake always runs open loop",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop: Poisson session arrivals at this many workflows per second "
        "(latency counts from arrival; --concurrency caps the sessions open at once)",
    )
    p.add_argument(
        "--load",
        type=float,
        default=None,
        help="open loop at this fraction of the strongest baseline's capacity "
        "(lru:workflow's closed-loop throughput at --concurrency, measured first)",
    )
    p.add_argument(
        "--gap-scale",
        type=float,
        default=1.0,
        help="factor on every tool and think gap of the workload (e.g. 10: agents wait ten "
        "times longer on tools and users)",
    )
    p.add_argument(
        "--gap-model",
        choices=GAP_MODELS,
        default="bundled",
        help="the gaps a bundled app draws: its own (bundled) or documented tool latencies "
        "and think times (cited; sources in docs/gaps.md)",
    )
    p.add_argument(
        "--slo-s",
        type=float,
        default=None,
        help="workflow latency target: each row also reports its goodput (workflows per "
        "second within it)",
    )
    p.add_argument(
        "--gpu-kv-tokens",
        type=positive_int,
        default=None,
        help="GPU KV capacity in tokens (default: half the concurrent working set, capped "
        "by the hardware profile's KV capacity)",
    )
    p.add_argument(
        "--host-kv-tokens",
        type=int,
        default=None,
        help="host tier in tokens (default: 2x the GPU tier, as SGLang HiCache)",
    )
    p.add_argument(
        "--host-tier",
        choices=("write-through", "exclusive"),
        default=d.host_tier,
        help="host tier model: write-through (default; SGLang HiCache, the paper's "
        "baseline: the host keeps a copy of what is on the GPU) or exclusive "
        "(TensorRT-LLM: a block is offloaded when the GPU evicts it)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
    p.add_argument(
        "--predictor",
        default=d.predictor,
        help="forecaster for he/pbkv: online (default: learns as the row runs, what "
        "open_runtime and pbkv serve run), or fitted before the run on --train-workflows: "
        "markov, markov-1..3, graphsage, oracle, uniform",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="GraphSAGE checkpoint folder (pbkv train); without one, graphsage is trained "
        "on the --train-workflows traces without text",
    )
    p.add_argument(
        "--noise",
        type=float,
        default=d.noise,
        help="prediction noise lambda in [0, 1]: P~ = (1-lambda) P + lambda U",
    )
    p.add_argument(
        "--train-workflows",
        type=positive_int,
        default=d.train_workflows,
        help="workflows (another seed) the predictor is fitted on",
    )
    from pbkv.engines.sim.profile import list_profiles

    shipped = list_profiles()
    p.add_argument(
        "--hardware",
        default=d.hardware,
        help=f"hardware profile: {', '.join(shipped.hardware)} or a TOML file",
    )
    p.add_argument(
        "--model", default=d.model, help=f"model profile: {', '.join(shipped.model)} or a TOML file"
    )
    p.add_argument(
        "--block-size", type=positive_int, default=d.block_size, help="tokens per KV block"
    )
    p.add_argument("--horizon", type=positive_int, default=d.horizon, help="score horizon K")
    p.add_argument("--gamma", type=float, default=d.gamma, help="score decay in (0, 1]")
    p.add_argument(
        "--check-integrity",
        action="store_true",
        help="assert the KV manager's invariants after every engine step (slow)",
    )


def config_from(args: argparse.Namespace):  # -> BenchConfig
    """Return the :class:`BenchConfig` the parsed options describe.

    Raises:
        ValueError: naming ``--host-kv-tokens`` < 0 or ``--noise`` outside [0, 1].
    """
    from pbkv.bench.config import BenchConfig
    from pbkv.examples import get_app

    if args.host_kv_tokens is not None and args.host_kv_tokens < 0:
        raise ValueError(f"--host-kv-tokens must be >= 0, got {args.host_kv_tokens}")
    if not 0.0 <= args.noise <= 1.0:
        raise ValueError(f"--noise must be in [0, 1], got {args.noise}")
    return BenchConfig(
        app=args.app,
        policies=args.policies,
        workflows=args.workflows,
        concurrency=args.concurrency,
        gpu_kv_tokens=args.gpu_kv_tokens,
        host_kv_tokens=args.host_kv_tokens,
        host_tier=args.host_tier,
        rate=args.rate,
        load=args.load,
        slo_s=args.slo_s,
        gap_scale=args.gap_scale,
        gap_model=args.gap_model,
        seed=args.seed,
        predictor=args.predictor,
        train_workflows=args.train_workflows,
        hardware=args.hardware,
        model=args.model,
        block_size=args.block_size,
        horizon=args.horizon,
        gamma=args.gamma,
        noise=args.noise,
        checkpoint=args.checkpoint,
        check_integrity=args.check_integrity,
        scheduler=args.scheduler,
        # what run_bench does, so the JSON's config says how the run went
        open_loop=args.open_loop or bool(getattr(get_app(args.app), "open_loop", False)),
    )
