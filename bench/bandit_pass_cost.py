"""What the bandit adds to a decider pass at 1,000 nodes x 8 GPUs: the live `EngineCore` with the
built-in rules over one snapshot (2,450 running 2-GPU jobs, 20 idle nodes, 80 waiting 16-GPU jobs
that never fit, as bench/scale.py has it, plus `--starts` waiting 2-GPU jobs that do), evaluated
with `bandit.mode` off and active, alternately, in one process. Prints the median and p99 pass
time of each and their ratio: the figure that holds on a shared machine is the ratio.

    .venv/bin/python bench/bandit_pass_cost.py [--nodes 1000] [--starts 20] [--passes 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.decider.admission_order import admission_order  # noqa: E402
from services.decider.bandit.policy import BanditPolicy  # noqa: E402
from services.decider.core import EngineCore  # noqa: E402
from services.decider.snapshot import JobView, Snapshot  # noqa: E402
from services.decider.telemetry import TelemetryView  # noqa: E402
from shared.contracts.actions import NodeGpus  # noqa: E402
from shared.contracts.job_status import JobStatus  # noqa: E402
from shared.contracts.strategies import BanditConfig  # noqa: E402
from shared.infra.config import load_config  # noqa: E402
from sim.cluster import Topology  # noqa: E402
from sim.simulator import SimRunner, load_rules, run_sync  # noqa: E402

T0 = 1_700_000_000.0
IDLE = 20


_NODES: dict = {}


def snapshot(nodes: int, starts: int, ts: float) -> Snapshot:
    """The same cluster at `ts`; node views kept from pass to pass, as the live decider keeps them
    while their devices do not change."""
    topology = Topology(nodes * 8)
    names = topology.node_names()
    jobs, used = [], {}
    for i, name in enumerate(names[IDLE:]):
        # One to four 2-GPU jobs a node: the waiting 2-GPU jobs have nodes of several shapes to choose among.
        for k in range(1 + i % 4):
            part = NodeGpus(node=name, gpus=(2 * k, 2 * k + 1))
            used.setdefault(name, set()).update(part.gpus)
            jobs.append(
                JobView(
                    id=f"r{i}-{k}",
                    name="r",
                    status=JobStatus.RUNNING,
                    priority="low",
                    priority_rank=1,
                    gpus=2,
                    preemptible=True,
                    submitted_at=T0,
                    placement=(part,),
                    attempt=1,
                    step=10,
                    step_time_s=1.0,
                )
            )
    for i in range(80):
        jobs.append(
            JobView(
                id=f"w{i}",
                name="w",
                status=JobStatus.PENDING,
                priority="low",
                priority_rank=1,
                gpus=16,
                preemptible=True,
                submitted_at=T0 + i,
            )
        )
    for i in range(starts):
        jobs.append(
            JobView(
                id=f"s{i}",
                name="s",
                status=JobStatus.PENDING,
                priority="low",
                priority_rank=1,
                gpus=2,
                preemptible=True,
                submitted_at=T0 + 100 + i,
            )
        )
    config = load_config()
    if nodes not in _NODES:
        _NODES[nodes] = topology.node_views(used, T0)
    return Snapshot(
        ts=ts,
        nodes=dict(_NODES[nodes]),
        jobs=tuple(jobs),
        telemetry=TelemetryView.empty(ts),
        order=admission_order(config, jobs),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--starts", type=int, default=20, help="waiting 2-GPU jobs that fit (the bandit's choices)")
    parser.add_argument("--passes", type=int, default=30, help="passes per mode")
    args = parser.parse_args(argv)
    config = load_config()
    rules = load_rules(config)
    cores = {"off": EngineCore(runner=SimRunner()), "active": EngineCore(runner=SimRunner())}  # rules inline
    cores["active"].bandit = BanditPolicy(
        BanditConfig(mode="active", explore_per_hour=10**6, explore_per_job=10**6, cooldown_s=0)
    )
    times: dict[str, list[float]] = {"off": [], "active": []}
    chosen = 0
    for i in range(args.passes + 2):  # the first two of each are warm-up
        for mode, core in cores.items():
            snap = snapshot(args.nodes, args.starts, T0 + 10 * i)
            core.in_flight.clear()
            started = time.perf_counter()
            result = run_sync(core.evaluate(snap, rules, config))
            if i >= 2:
                times[mode].append(1000 * (time.perf_counter() - started))
                chosen += sum(1 for e in result.bandit if e.kind == "bandit.decision")
    p = {m: (statistics.median(t), sorted(t)[int(0.99 * (len(t) - 1))]) for m, t in times.items()}
    print(f"pass cost: {args.nodes:,} nodes x 8 GPUs, {args.starts} starts that fit a pass, {args.passes} passes each")
    for mode in ("off", "active"):
        print(f"  bandit {mode:<6} median {p[mode][0]:.1f} ms, p99 {p[mode][1]:.1f} ms")
    print(
        f"  active / off: median {p['active'][0] / p['off'][0]:.3f} x; the bandit chose for {chosen / args.passes:.1f} "
        "starts a pass"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
