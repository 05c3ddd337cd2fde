"""`adc sim TRACE --gpus N`: replay a trace through the decider's own policy code, several
policies side by side on the same enriched workload (see sim/)."""

from __future__ import annotations

import argparse
import json
import sys

from sim.policies import DEFAULT_POLICIES, OVERRIDES


def cmd_sim(args: argparse.Namespace) -> int:
    from shared.infra.config import ConfigError, load_config
    from sim.report import plot, table
    from sim.run import Comparison, compare
    from sim.simulator import SimOptions
    from sim.step_model import StepModel
    from sim.traces import TraceError

    try:
        config = load_config(args.config)
        results, rows = compare(
            Comparison(
                trace=args.trace,
                gpus=args.gpus,
                gpus_per_node=args.gpus_per_node,
                start_s=args.start,
                days=args.days,
                policies=tuple(args.policy or DEFAULT_POLICIES),
                seed=args.seed,
                config=config,
                options=SimOptions(
                    **({} if args.pass_gap is None else {"pass_gap_s": args.pass_gap}),
                    step_model=StepModel() if args.step_model else None,
                ),
            )
        )
    except (OSError, TraceError, ConfigError, ValueError) as err:
        print(f"adc sim: {err}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps({"trace": args.trace, "gpus": args.gpus, "seed": args.seed, "policies": rows}, indent=2))
    else:
        print(f"{args.trace}: {rows[0]['jobs']} jobs on {args.gpus} GPUs, seed {args.seed}")
        print(table(rows))
    if args.plot:
        for path in plot(results, rows, args.plot, f"{args.trace} on {args.gpus} GPUs"):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def register(sub, with_output) -> None:
    p = with_output(
        sub.add_parser("sim", help="simulate a trace under several policies, through the decider's own code")
    )
    p.add_argument("trace", help="a Philly, ITP (clusterNN.csv) or Pollux (workload-N.csv) trace")
    p.add_argument("--gpus", type=_positive, required=True, help="GPUs in the simulated cluster")
    p.add_argument("--gpus-per-node", type=_positive, default=8, help="GPUs per node (default: 8)")
    p.add_argument("--start", type=float, default=0.0, metavar="S", help="skip the first S seconds of the trace")
    p.add_argument("--days", type=float, default=None, metavar="D", help="replay D days of submissions (default: all)")
    p.add_argument(
        "--policy",
        action="append",
        choices=list(OVERRIDES),
        metavar="NAME",
        help=f"repeatable; default all: {', '.join(DEFAULT_POLICIES)}; also adc-bandit, adc-bandit-shadow",
    )
    p.add_argument("--seed", type=int, default=0, help="workload enrichment seed (default: 0)")
    p.add_argument(
        "--pass-gap",
        type=_non_negative,
        default=None,
        metavar="S",
        help="event-driven decider passes at least S simulated seconds apart (default: 10; 0 for one pass"
        " per event time, slower on dense traces; a satisfied memory window always passes at once)",
    )
    p.add_argument(
        "--step-model",
        action="store_true",
        help="placement quality changes step time (co-location, NUMA, racks: sim/step_model.py), for every"
        " policy; what adc-bandit learns from (off by default)",
    )
    p.add_argument("--plot", metavar="FOLDER", help="write jct_cdf.png and utilization.png there")
    p.set_defaults(func=cmd_sim)


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, at least 0, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
