"""Scheduling benchmark: ADC's policy set against static FIFO and Tiresias-style LAS, and its
ablations, through the live decider's code on real traces (see sim/).

    .venv/bin/python bench/scheduling.py [--policy NAME ...] [--seed N] [--also TRACE:GPUS[:DAYS] ...]
                                         [--only] [--digest]
    .venv/bin/python bench/scheduling.py --sweep [--seeds 0,1,2]

Workloads: ITP cluster02, first 14 days, 96 GPUs; Pollux workload-6 on 64 GPUs. Prints one table
per workload, the wall and CPU time of each run, and the issue's targets with the measured ratios
(and what oom_protection did with the enrichment's memory spikes). `--also` adds a workload, e.g.
the whole Philly trace: `--also ../shared/traces/philly/philly.csv:512`; `--only` runs just the
`--also` workloads. `--digest` prints, per policy, a hash of every decision and every pass's
pending reasons (sim/simulator.py `SimOptions.digest`): two code versions whose digests match
decided and explained alike, pass by pass (a check for changes meant only to be faster).
`--sweep` checks that a result is not one workload's: adc, las and fifo on other ITP clusters,
cluster sizes and Pollux workloads, for several enrichment seeds, one line each (adc / las, the
high-priority p95 delay, utilization against fifo's) and the geometric mean of the ratios.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.policies import DEFAULT_POLICIES  # noqa: E402
from sim.report import table  # noqa: E402
from sim.run import Comparison, compare  # noqa: E402
from sim.simulator import SimOptions  # noqa: E402
from sim.traces import read_trace, window  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
WORKLOADS = [
    ("ITP cluster02, first 14 days, 96 GPUs", TRACES / "msr_itp_elasticflow" / "cluster02.csv", 96, 14.0, 0.75),
    ("Pollux workload-6, 64 GPUs", TRACES / "pollux_osdi21" / "workload-6.csv", 64, None, 1.0),
]


def targets(rows: list[dict], las_ratio: float, no_wait_s: float) -> list[str]:
    by = {r["policy"]: r for r in rows}
    if not {"adc", "las", "fifo"} <= set(by):
        return []
    adc, las, fifo = by["adc"], by["las"], by["fifo"]
    ratio = adc["jct_s"]["avg"] / las["jct_s"]["avg"]
    bound = (
        f"  no-wait bound (every job at once on the devices it asked for): avg JCT {no_wait_s:,.0f} s "
        f"= {no_wait_s / las['jct_s']['avg']:.3f} x las; only growing elastic jobs gets below it"
    )
    high = adc["queueing_s"].get("high", {}).get("p95") or 0.0
    return [
        f"  adc avg JCT / las = {ratio:.3f} (target <= {las_ratio}): {'ok' if ratio <= las_ratio else 'MISSED'}",
        f"  adc high-priority p95 queueing delay = {high:.0f} s (target <= 60): {'ok' if high <= 60 else 'MISSED'}",
        f"  adc avg utilization {adc['utilization']:.1%} vs fifo {fifo['utilization']:.1%}: "
        f"{'ok' if adc['utilization'] >= fifo['utilization'] else 'MISSED'}",
        f"  memory spikes {adc['memory_spikes']}: adc moved {adc['oom_migrations']}, stopped "
        f"{sum(adc['oom_actions'].values()) - adc['oom_migrations']} otherwise, {adc['oom_crashes']} died; "
        f"fifo {fifo['oom_crashes']} died, las {las['oom_crashes']} died",
        bound,
    ]


SWEEP = [
    ("cluster02", TRACES / "msr_itp_elasticflow" / "cluster02.csv", 96, 14.0),
    ("cluster02", TRACES / "msr_itp_elasticflow" / "cluster02.csv", 64, 14.0),
    ("cluster01", TRACES / "msr_itp_elasticflow" / "cluster01.csv", 96, 14.0),
    ("cluster01", TRACES / "msr_itp_elasticflow" / "cluster01.csv", 48, 14.0),
    ("cluster03", TRACES / "msr_itp_elasticflow" / "cluster03.csv", 96, 14.0),
    ("workload-6", TRACES / "pollux_osdi21" / "workload-6.csv", 64, None),
    ("workload-3", TRACES / "pollux_osdi21" / "workload-3.csv", 48, None),
    ("workload-1", TRACES / "pollux_osdi21" / "workload-1.csv", 64, None),
]


def sweep(seeds: list[int], options: SimOptions) -> None:
    started, cpu = time.perf_counter(), time.process_time()
    print(
        f"{'workload':<22}{'seed':>5}{'adc JCT s':>11}{'las JCT s':>11}{'adc/las':>9}{'high p95 s':>11}"
        f"{'(las)':>7}{'adc util':>10}{'fifo util':>10}"
    )
    ratios = []
    for seed in seeds:
        for name, path, gpus, days in SWEEP:
            _, rows = compare(
                Comparison(
                    trace=str(path), gpus=gpus, days=days, policies=("adc", "las", "fifo"), seed=seed, options=options
                )
            )
            adc, las, fifo = rows
            ratio = adc["jct_s"]["avg"] / las["jct_s"]["avg"]
            ratios.append(ratio)
            high, las_high = ((r["queueing_s"].get("high", {}).get("p95") or 0.0) for r in (adc, las))
            label = f"{name}/{gpus}" + (f", {days:g} d" if days else "")
            print(
                f"{label:<22}{seed:>5}{adc['jct_s']['avg']:>11,.0f}{las['jct_s']['avg']:>11,.0f}{ratio:>9.3f}"
                f"{high:>11.0f}{las_high:>7.0f}{adc['utilization']:>10.1%}{fifo['utilization']:>10.1%}",
                flush=True,
            )
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(
        f"geometric mean of adc/las over {len(ratios)} runs: {mean:.3f}; wall {time.perf_counter() - started:.0f} s, "
        f"CPU {time.process_time() - cpu:.0f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", action="append", help="policies to run (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="TRACE:GPUS[:DAYS]",
        help="another workload, e.g. ../shared/traces/philly/philly.csv:256:7",
    )
    parser.add_argument("--only", action="store_true", help="run only the --also workloads")
    parser.add_argument("--digest", action="store_true", help="print a hash of each policy's decisions and reasons")
    parser.add_argument("--sweep", action="store_true", help="adc, las and fifo on other traces, sizes and seeds")
    parser.add_argument("--seeds", default="0,1,2", help="enrichment seeds for --sweep (comma-separated)")
    parser.add_argument(
        "--pass-gap",
        type=float,
        default=SimOptions.pass_gap_s,
        metavar="S",
        help=f"event-driven passes at least S simulated seconds apart (default: {SimOptions.pass_gap_s:g})",
    )
    args = parser.parse_args()
    if args.sweep:
        try:
            seeds = [int(s) for s in args.seeds.split(",")]
        except ValueError:
            parser.error(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2")
        sweep(seeds, SimOptions(pass_gap_s=args.pass_gap))
        return 0
    policies = tuple(args.policy or DEFAULT_POLICIES)
    workloads = [] if args.only else list(WORKLOADS)
    for extra in args.also:
        path, gpus, *days = extra.split(":")
        workloads.append(
            (
                f"{Path(path).name}, {gpus} GPUs" + (f", {days[0]} days" if days else ""),
                Path(path),
                int(gpus),
                float(days[0]) if days else None,
                None,
            )
        )
    for title, path, gpus, days, las_ratio in workloads:
        started, cpu = time.perf_counter(), time.process_time()
        results, rows = compare(
            Comparison(
                trace=str(path),
                gpus=gpus,
                days=days,
                policies=policies,
                seed=args.seed,
                options=SimOptions(digest=args.digest, pass_gap_s=args.pass_gap),
            )
        )
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        print(
            f"\n== {title}: {rows[0]['jobs']} jobs, seed {args.seed}, {len(policies)} policies: wall {wall:.1f} s, "
            f"CPU {cpu:.1f} s (on a shared machine CPU time is the figure to compare)"
        )
        print(table(rows))
        for r in results if args.digest else []:
            print(f"  digest {r.policy}: {r.digest} ({r.passes} passes, {r.counters.starts} starts)")
        jobs = window(read_trace(path, args.seed), 0.0, days)
        no_wait = sum(j.duration_s for j in jobs) / len(jobs)
        for line in targets(rows, las_ratio, no_wait) if las_ratio else []:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
