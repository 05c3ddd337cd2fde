"""load_balance: every `rebalance_interval`, move work off hot nodes when it pays.

Design note. GPUs are never shared between jobs, so what jobs on one node contend for is the
rest of the node: host CPU (data loading), PCIe, power and cooling. A node's load is the mean,
over the last interval, of `metric` (host CPU by default, or GPU utilization or memory). A
node at or above `hot_threshold` that runs more than one job is hot. For each hot node the
rule moves its smallest job (fewest devices, then least progress lost, never more than
`max_lost_s`) to free devices of the same GPU model on a node whose load is at least
`min_gain` lower: with method `least_loaded` the coolest such node, with `topology_aware`
the tightest placement among them. One move per hot node per interval; the engine's
cooldown keeps a job from bouncing.
"""

from __future__ import annotations

from services.decider.free_devices import FreeDevices
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import Snapshot
from services.decider.telemetry import TelemetryView
from services.decider.telemetry_types import sample_reference
from shared.contracts.actions import Migrate
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import LoadBalance

NAME = "load_balance"


def period(config: LoadBalance) -> float:
    return config.rebalance_interval


def decide(snapshot: Snapshot, config: LoadBalance) -> RuleOutput:
    telemetry = snapshot.telemetry
    if telemetry is None:
        return RuleOutput([])
    span = config.rebalance_interval
    means = telemetry.node_means(config.metric, span)
    load = {n: means[n] for n, v in snapshot.nodes.items() if v.schedulable and n in means}
    if not any(v >= config.hot_threshold for v in load.values()):
        return RuleOutput([])  # no node is hot: nothing to move (the usual pass; the rest loops over every running job)
    jobs_on: dict[str, list] = {}
    for job in snapshot.running():
        for part in job.placement:
            jobs_on.setdefault(part.node, []).append(job)
    free = FreeDevices.of(snapshot)
    actions, moved = [], set()
    for hot in sorted(
        (n for n, v in load.items() if v >= config.hot_threshold and len(jobs_on.get(n, ())) > 1),
        key=lambda n: -load[n],
    ):
        cool = {n for n, v in load.items() if load[hot] - v >= config.min_gain}
        if not cool:
            continue
        movable = sorted(
            (
                j
                for j in jobs_on[hot]
                if len(j.placement) == 1 and j.id not in moved and j.lost_progress_s(snapshot.ts) <= config.max_lost_s
            ),
            key=lambda j: (j.gpu_count, j.lost_progress_s(snapshot.ts), j.id),
        )
        for job in movable:
            first = job.placement[0]
            model = snapshot.nodes[hot].gpu(first.gpus[0]).model

            def eligible(n: str, g: int, m: str = model, cool: set = cool) -> bool:
                return n in cool and snapshot.nodes[n].gpu(g).model == m

            if config.method == "least_loaded":
                target = None
                for node in sorted(cool, key=lambda n: (load[n], n)):
                    target = place(
                        job.gpu_count,
                        free,
                        snapshot.nodes,
                        eligible=lambda n, g, m=model, t=node: n == t and snapshot.nodes[n].gpu(g).model == m,
                    )
                    if target is not None:
                        break
            else:
                target = place(job.gpu_count, free, snapshot.nodes, eligible=eligible)
            if target is None:
                continue
            dest = target.placement[0].node
            free.book(target.placement)
            moved.add(job.id)
            actions.append(
                Migrate(
                    job_id=job.id,
                    placement=list(target.placement),
                    reason_code=ReasonCode.LOAD_BALANCE_MIGRATE,
                    reason=(
                        f"node {hot} is hot ({config.metric} {load[hot]:.0%} over {span:g} s, threshold "
                        f"{config.hot_threshold:.0%}); {dest} is at {load[dest]:.0%}: move {job.id} "
                        f"({job.gpu_count} device(s)) there ({config.method})"
                    ),
                    evidence={
                        "metric": config.metric,
                        "hot_node": hot,
                        "hot_load": round(load[hot], 4),
                        "target_node": dest,
                        "target_load": round(load[dest], 4),
                        "min_gain": config.min_gain,
                        "loads": {n: round(v, 4) for n, v in sorted(load.items())},
                        "method": config.method,
                        "lost_s": round(job.lost_progress_s(snapshot.ts), 1),
                    }
                    | _traced(telemetry, hot, snapshot.ts - span, snapshot.ts),
                )
            )
            break
    return RuleOutput(actions)


def _traced(telemetry: TelemetryView, node: str, since: float, until: float) -> dict:
    """The hot node's newest sample of the span that named its publish span, for the decision to link."""
    traced = telemetry.traced.within(node, since, until)
    return {"traced_sample": sample_reference(node, *traced)} if traced else {}


RULE = Rule(
    name=NAME,
    decide=decide,
    config=LoadBalance,
    period=period,
    precedence=70,
    description="every rebalance_interval, move the smallest job off a hot node to a cooler one",
)
