"""queue_order's preemptive half against its plain definition: on random clusters and queues, the
rule (victims listed only where a waiting job could take them, groups tested from counts of free
devices kept per group) proposes exactly what releasing on copies and placing for every group does."""

import dataclasses
import math
import random

import pytest

from services.decider.admission_order import Keys, remaining_gpu_s
from services.decider.admission_plan import plan_admission
from services.decider.placement import place
from services.decider.rules import queue_order
from shared.contracts.job_status import JobStatus
from shared.contracts.strategies import QueueOrder
from tests.unit.decider.builders import Cluster

LEVELS = ("high", "medium", "low")


def reference(snapshot, config):
    """The rule as first written: every preemptible running job a candidate, each group tried on a copy."""
    plan = plan_admission(snapshot)
    free, keys = plan.free, Keys(config, snapshot.jobs)
    las = config.method == "las"

    def mine(job):
        return keys.key(job) if las else remaining_gpu_s(job, keys.typical_s)

    def bar(v):
        key = keys.key(v)
        return key if las else (key[0] - config.protocol_cost_s * v.gpu_count) / config.preempt_ratio

    ranked = sorted(
        (v for v in snapshot.running() if v.preemptible and v.placement),
        key=lambda v: (keys.key(v), v.gpu_count, v.id),
        reverse=True,
    )
    taken, actions, pending = set(), [], {}
    for job in plan.waiting:
        m = mine(job)
        candidates = []
        for v in (v for v in ranked if v.priority_rank == job.priority_rank):
            key = keys.key(v)
            if (not key > m) if las else (not key[0] / config.preempt_ratio > m):
                break  # the rule's scan ends here: keys only fall, and a bar is never above its key
            if bar(v) > m and v.id not in taken:
                candidates.append(v)
        candidates = candidates[: config.max_victims]
        trial, chosen = free.copy(), []
        for victim in candidates:
            chosen.append(victim)
            trial.release(victim.placement)
            if place(job.gpus, trial, snapshot.nodes, multi_node=job.multi_node) is not None:
                break
        else:
            continue
        for victim in sorted(chosen, key=keys.key):
            rest = free.copy()
            for other in chosen:
                if other is not victim:
                    rest.release(other.placement)
            if len(chosen) > 1 and place(job.gpus, rest, snapshot.nodes, multi_node=job.multi_node) is not None:
                chosen.remove(victim)
        for victim in chosen:
            taken.add(victim.id)
            free.release(victim.placement)
            actions.append((victim.id, job.id))
        fitted = place(job.gpus, free, snapshot.nodes, multi_node=job.multi_node)
        if fitted is not None:
            free.book(fitted.placement)
        pending[job.id] = "making room for it: preempting " + ", ".join(v.id for v in chosen)
    return actions, pending


def random_cluster(rng: random.Random, nan: bool) -> Cluster:
    c = Cluster()
    free = {}
    for i in range(rng.randint(2, 6)):
        size = rng.choice((8, 8, 4))
        c.node(f"n{i}", size, per_domain=4, rack=f"r{i // 3}")
        free[f"n{i}"] = list(range(size))

    def progress(steps=(None, 100, 1_000, 5_000, 20_000)):
        step_time = rng.choice((None, 0.5, 1.0, 2.0, 3.0))
        if nan and rng.random() < 0.15:
            step_time = math.nan
        return {"max_steps": rng.choice(steps), "step": rng.choice((None, 0, 50, 400)), "step_time_s": step_time}

    for j in range(rng.randint(8, 30)):
        rank = rng.randrange(3)
        want = rng.choice((1, 1, 2, 4, 8, 12))
        placement, need = {}, want
        for node in rng.sample(sorted(free), len(free)):
            take = free[node][:need]
            if take:
                placement[node] = tuple(take)
                free[node] = free[node][len(take) :]
                need -= len(take)
            if not need:
                break
        if need:
            continue
        c.job(
            f"r{j}",
            placement,
            priority=LEVELS[rank],
            rank=rank,
            preemptible=rng.random() < 0.85,
            submitted=float(j),
            **progress(),
        )
    for j in range(rng.randint(1, 10)):
        rank = rng.randrange(3)
        c.pending(
            f"w{j}",
            gpus=rng.choice((1, 2, 3, 4, 8, 10, 16)),
            priority=LEVELS[rank],
            rank=rank,
            multi_node=rng.random() < 0.4,
            submitted=100.0 + j,
            **progress((None, 10, 100, 1_000)),
        )
    return c


@pytest.mark.parametrize("method", ["shortest_remaining", "las"])
def test_the_rule_proposes_what_its_plain_definition_does(method):
    rng = random.Random(5)
    preempted = 0
    for trial in range(200):
        config = QueueOrder(
            enabled=True,
            method=method,
            max_victims=rng.choice((1, 2, 3, 8)),
            preempt_ratio=rng.choice((1.0, 2.0)),
            protocol_cost_s=rng.choice((0.0, 60.0)),
            las_thresholds_gpu_s=[rng.choice((20.0, 100.0, 1000.0))],
        )
        snapshot = random_cluster(rng, nan=trial % 4 == 0).snapshot()
        keys = Keys(config, snapshot.jobs)
        snapshot = dataclasses.replace(
            snapshot, order={j.id: keys.key(j) for j in snapshot.jobs if j.status == JobStatus.PENDING}
        )
        out = queue_order.decide(snapshot, config)
        expected_actions, expected_pending = reference(snapshot, config)
        assert [(a.job_id, a.evidence["for_job"]) for a in out.actions] == expected_actions, trial
        assert out.pending == expected_pending, trial
        preempted += len(expected_actions)
    assert preempted > 20  # groups were taken, not only passed over
