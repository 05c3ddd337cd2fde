"""elastic_scale: grow running elastic jobs into idle GPUs; shrink them when others wait.

An elastic job declares `min_gpus` and/or `max_gpus` beside `gpus`.
- Grow: when nothing is being admitted and no waiting job can be helped by shrinking (after
  replaying admission), a running elastic job of a level in `grow_levels` (None: every level)
  grows towards its `max_gpus` into free devices beside its own (the same NVLink domain first),
  or on other nodes if it allows multi-node; a one-node job that would get more on another node
  restarts there instead. Free devices are split so none is promised twice. Devices a waiting job
  cannot use now would otherwise idle; once it can, the grown jobs are shrunk back (below).
- Shrink: when a job waits and cannot fit, running elastic jobs of the same level above their
  floor (`min_gpus`) are shrunk, cheapest first, each just as far as needed. Making room for a
  higher level is `priority_scheduling`'s job. Shrink actions name the job they make room for
  (`for_job`), so arbitration takes them all or none.
The executor carries a scale out as checkpoint-stop and restart with the new device count, the
global batch kept by gradient accumulation. Off when `controller.enable_auto_scale` is false.
"""

from __future__ import annotations

import math

from services.decider.admission_order import configured as queue_configured
from services.decider.admission_plan import plan_admission
from services.decider.free_devices import FreeDevices
from services.decider.placement import merged, place, without
from services.decider.plugin import Rule, RuleOutput, section_config
from services.decider.shrink_peers import ShrinkPeers, floor_yield
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import NodeGpus, Scale
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.contracts.strategies import ElasticScale, QueueOrder
from shared.infra.config import AdcConfig
from shared.specs.quota import TeamUsage, gpu_headroom

NAME = "elastic_scale"


class ElasticSettings(ElasticScale):
    auto_scale: bool = True  # controller.enable_auto_scale
    queue: QueueOrder = QueueOrder(enabled=False)  # strategies.queue_order: who a shrink may be for


def bind(config: AdcConfig) -> ElasticSettings:
    section = section_config(config, NAME, ElasticScale)
    try:
        queue = queue_configured(config)
    except ValueError:
        queue = QueueOrder(enabled=False)  # reported as queue_order's own config problem
    return ElasticSettings(**section.model_dump(), auto_scale=config.controller.enable_auto_scale, queue=queue)


def decide(snapshot: Snapshot, config: ElasticSettings) -> RuleOutput:
    if not config.auto_scale:
        return RuleOutput([])
    plan = plan_admission(snapshot)
    if plan.waiting:
        shrunk = _shrink(snapshot, plan.waiting, plan.free.copy(), config) if config.shrink else RuleOutput([])
        if shrunk.actions or plan.admitted:
            return shrunk
        # Never into devices a higher level waits for: priority_scheduling is making room there.
        grown = _grow(snapshot, plan.free, config, below_rank=min(j.priority_rank for j in plan.waiting))
        return RuleOutput(grown.actions, shrunk.pending)
    if plan.admitted:
        return RuleOutput([])  # devices are about to be taken by admissions: do not grab them
    return _grow(snapshot, plan.free, config)


def _grow(snapshot: Snapshot, free: FreeDevices, config: ElasticSettings, below_rank: int | None = None) -> RuleOutput:
    actions = []
    growable = [
        j
        for j in snapshot.running_elastic()
        if j.max_gpus
        and j.max_gpus > j.gpu_count
        and (config.grow_levels is None or j.priority in config.grow_levels)
        and (below_rank is None or j.priority_rank <= below_rank)
    ]
    quotas = bool(snapshot.quotas)  # without any, usage is not worth counting
    teams, users = (snapshot.team_usage(), snapshot.user_usage()) if quotas else ({}, {})  # plus what this pass grants
    left = _remaining_s(snapshot)
    for job in sorted(growable, key=lambda j: (j.priority_rank, -left(j), j.submitted_at, j.id)):
        if not free.total():
            break  # no free device anywhere: nobody can grow
        user = (job.team, job.owner)
        room = (
            gpu_headroom(snapshot.quotas.get(job.team), teams.get(job.team, TeamUsage()), users.get(user, TeamUsage()))
            if quotas
            else None
        )
        want = job.max_gpus - job.gpu_count if room is None else min(job.max_gpus - job.gpu_count, room)
        if want > 0 and left(job) * want / (job.gpu_count + want) <= config.queue.protocol_cost_s:
            continue  # even all it may take cannot repay the move (checked below for what it gets)
        extra = _beside(snapshot, job, free, want) if want > 0 else []  # never past the team's or user's quota
        added = sum(len(p.gpus) for p in extra)
        # A one-node job may grow by restarting elsewhere; a multi-node one already takes free devices anywhere.
        moved = (
            _elsewhere(snapshot, job, free, job.gpu_count + want, job.gpu_count + added)
            if added < want and not job.multi_node
            else None
        )
        if moved is not None:
            added = sum(len(p.gpus) for p in moved) - job.gpu_count
        if not added:
            continue
        # A growth stops the job for a checkpoint and a restart: worth it only if the time it can
        # save, at best the added share of what is left, exceeds that.
        if left(job) * added / (job.gpu_count + added) <= config.queue.protocol_cost_s:
            continue
        teams[job.team] = teams.get(job.team, TeamUsage()) + added
        users[user] = users.get(user, TeamUsage()) + added
        if moved is not None:
            # Its own devices are not offered to anyone else this pass: it holds them until it stops.
            extra, placement = without(moved, job.placement), moved
        else:
            placement = merged(job.placement, extra)
        free.book(extra)
        n = sum(len(p.gpus) for p in placement)
        where = (
            f"restart on {', '.join(p.node for p in placement)}, where {n} fit"
            if moved is not None
            else f"{sum(len(p.gpus) for p in extra)} device(s) beside it are idle"
        )
        actions.append(
            Scale(
                job_id=job.id,
                placement=placement,
                reason_code=ReasonCode.ELASTIC_GROW,
                reason=f"no job waits and {where}: grow from {job.gpu_count} to {n} of at most {job.max_gpus}",
                evidence={
                    "from_gpus": job.gpu_count,
                    "to_gpus": n,
                    "max_gpus": job.max_gpus,
                    "moved": moved is not None,
                    "added": [p.model_dump() for p in extra],
                    "grow_levels": config.grow_levels,
                    "active_schedules": list(snapshot.schedules),
                },
            )
        )
    return RuleOutput(actions)


def _remaining_s(snapshot: Snapshot):
    """A running job's estimated seconds of training left (remaining steps x reported step time);
    unbounded when it does not declare max_steps or has not reported a step time yet."""

    def left(job: JobView) -> float:
        steps = job.remaining_steps()
        return steps * job.step_time_s if steps is not None and job.step_time_s else math.inf

    return left


def _beside(snapshot: Snapshot, job: JobView, free: FreeDevices, want: int) -> list[NodeGpus]:
    """Up to `want` free devices on the job's own nodes (its NVLink domains first), then elsewhere
    if it allows multi-node."""
    added: list[NodeGpus] = []
    for part in job.placement:
        node = snapshot.nodes.get(part.node)
        if node is None or want <= 0:
            continue
        here = free.free.get(part.node)
        if not here:
            continue  # nothing free beside it there (the usual case on a busy cluster)
        domains = {node.gpu(g).nvlink_domain for g in part.gpus}
        local = sorted(here, key=lambda g: (node.gpu(g).nvlink_domain not in domains, g))
        if local[:want]:
            added.append(NodeGpus(node=part.node, gpus=tuple(sorted(local[:want]))))
            want -= len(added[-1].gpus)
    if want > 0 and job.multi_node:
        trial = free.copy()
        trial.book(added)
        for n in range(want, 0, -1):
            more = place(n, trial, snapshot.nodes, multi_node=True, exclude=job.nodes())
            if more is not None:
                added += list(more.placement)
                break
    return added


def _elsewhere(snapshot: Snapshot, job: JobView, free: FreeDevices, most: int, beside: int) -> list[NodeGpus] | None:
    """A one-node placement of more than `beside` devices (what growing in place reaches), at most
    `most`, counting the job's own devices as free: a growth restarts the job anyway, so it may
    restart where there is room (a one-node job on a node whose neighbours stay)."""
    if free.most()[1] <= beside:
        return None  # its own node reaches `beside` at most, and no other node has more free
    trial = free.copy()
    trial.release(job.placement)
    for n in range(most, beside, -1):
        choice = place(n, trial, snapshot.nodes)
        if choice is not None:
            return list(choice.placement)
    return None


def _could_fit(
    job: JobView,
    peers: list[JobView],
    free: FreeDevices,
    room: dict[str, int] | None = None,
    yields: dict[str, list[tuple[str, int]]] | None = None,
) -> bool:
    """Whether free devices plus everything the peers could give up add up to the job, where it may go.
    `room` (free devices per node, as `free` has them) and `yields` (per peer, what shrinking it to
    its floor frees on each node) may be passed in, worked out once for many waiting jobs."""
    room = dict(room) if room is not None else {n: len(d) for n, d in free.free.items()}
    for peer in peers:
        given = yields.get(peer.id) if yields is not None else None
        if given is None:
            given = floor_yield(peer)
            if yields is not None:
                yields[peer.id] = given
        for node, count in given:
            if node in room:
                room[node] += count
    return (sum(room.values()) if job.multi_node else max(room.values(), default=0)) >= job.gpus


def _shrink(snapshot: Snapshot, waiting: list[JobView], free: FreeDevices, config: ElasticSettings) -> RuleOutput:
    actions, pending, taken = [], {}, set()
    # Peers above their floor (a job that is not elastic is at its floor).
    ahead = ShrinkPeers(snapshot, config.queue, [j for j in snapshot.running_elastic() if j.floor < j.gpu_count])
    room: dict[str, int] | None = None  # free devices per node, until `free` changes
    yields: dict[str, list[tuple[str, int]]] = {}
    # What happens below depends on the waiting job only through its size and its peers: a size no
    # shrink of the same peers fits is not tried again until a group is taken (free and taken change).
    no_fit: set[tuple] = set()
    for job in waiting:
        count = ahead.count(job)
        tried = (job.priority_rank, count, job.gpus, job.multi_node)
        if not count or tried in no_fit:  # asked before its peers are listed: most of a backlog stops here
            continue
        peers = [j for j in ahead.by_rank[job.priority_rank][:count] if j.id not in taken]
        if not peers:
            continue  # nobody to shrink: nothing below could fit it
        if room is None:
            room = {n: len(d) for n, d in free.free.items()}
        if not _could_fit(job, peers, free, room, yields):
            no_fit.add(tried)
            continue
        peers.sort(key=lambda j: (j.lost_gpu_hours(snapshot.ts), -(j.gpu_count - j.floor), j.id))
        trial = free.copy()
        group: list[tuple[JobView, tuple[NodeGpus, ...]]] = []
        fitted = None
        for peer in peers:
            for n in range(peer.gpu_count - 1, peer.floor - 1, -1):  # shrink just enough, down to the floor
                keep = peer.shrunk_to(n)
                test = trial.copy()
                test.release(without(peer.placement, keep))
                fitted = place(job.gpus, test, snapshot.nodes, multi_node=job.multi_node)
                if fitted is not None or n == peer.floor:
                    break
            trial = test
            group.append((peer, keep))
            if fitted is not None:
                break
        if fitted is None:
            no_fit.add(tried)
            continue
        free.free = trial.free
        free.book(fitted.placement)
        room = None
        no_fit.clear()
        pending[job.id] = Reason(
            ReasonCode.PENDING_MAKING_ROOM, "making room for it: shrinking " + ", ".join(p.id for p, _ in group)
        )
        for peer, keep in group:
            taken.add(peer.id)
            n = sum(len(p.gpus) for p in keep)
            actions.append(
                Scale(
                    job_id=peer.id,
                    placement=list(keep),
                    reason_code=ReasonCode.ELASTIC_SHRINK,
                    reason=(
                        f"job {job.id} (priority {job.priority}) waits for {job.gpus} device(s); {peer.id} is elastic "
                        f"at the same level: shrink from {peer.gpu_count} to {n} (floor {peer.floor})"
                    ),
                    evidence={
                        "for_job": job.id,
                        "from_gpus": peer.gpu_count,
                        "to_gpus": n,
                        "floor": peer.floor,
                        "lost_gpu_hours": round(peer.lost_gpu_hours(snapshot.ts), 4),
                        "group": [p.id for p, _ in group],
                    },
                )
            )
    return RuleOutput(actions, pending)


RULE = Rule(
    name=NAME,
    decide=decide,
    config=ElasticSettings,
    bind=bind,
    precedence=40,
    description="grow elastic jobs into idle GPUs when nobody waits; shrink them for same-level jobs that wait",
)
