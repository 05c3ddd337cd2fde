"""queue_order: a waiting job displaces running jobs of its own level that come later in the queue order.

Design note. `strategies.queue_order.method` sets the admission order inside a priority level
(see services/decider/admission_order.py: fifo, las, shortest_remaining); admission itself stays
`priority_fifo`'s, which reads that order from the snapshot. This rule is the preemptive half:
for each job the admission plan leaves waiting (in queue order), it looks for running,
preemptible jobs of the same level that the order puts behind it, and checkpoints and requeues
the furthest behind first, until the waiting job fits (at most `max_victims`); then drops the
ones not needed. "Behind" is, for las, a strictly higher attained-service queue; for
shortest_remaining, more than `preempt_ratio` times the waiting job's remaining work plus what
the move costs (`protocol_cost_s` of the victim's devices): estimates are noisy, and a
displacement is never free. Every preemption names the job it makes room for (`for_job`), so
arbitration takes the group whole or not at all; other levels are `priority_scheduling`'s.
With method fifo, or `preempt: false`, it proposes nothing.
"""

from __future__ import annotations

from services.decider.admission_order import NAME, Keys
from services.decider.admission_plan import plan_admission
from services.decider.free_devices import FreeDevices, counts_fit
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import Preempt
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.contracts.strategies import QueueOrder


class _Victims:
    """The running, preemptible jobs of each level, each with its key and how far behind a waiting
    job must be for it to be displaced: computed once a pass, not once per waiting job. Only those
    some waiting job could take are listed: of a level where a job waits, and further behind than
    the least far behind any of them must be (`behind` stops before the others for every one)."""

    def __init__(self, snapshot: Snapshot, keys: Keys, waiting: list[JobView]) -> None:
        self.keys = keys
        config = keys.config
        las, ratio = config.method == "las", config.preempt_ratio
        self._mine: dict[str, object] = {}  # waiting job -> what victims are held against (see mine)
        # Per level, the smallest `mine` of its waiting jobs; None: leave nothing out (a NaN, from a
        # step time gone wrong, orders against nothing).
        least: dict[int, object] = {}
        for job in waiting:
            mine, rank = self.mine(job), job.priority_rank
            low = least.get(rank, mine)
            least[rank] = None if low is None or mine != mine else min(low, mine)
        every: dict[int, list] = {rank: [] for rank in least}  # (sort key, bar, key, view), in running order
        unordered: set[int] = set()  # levels with a NaN key: sorted whole, as nothing can be left out
        # A view's entry depends on the view and the config alone once its key does not rest on the
        # typical step time (las; or a reported step time): then it is kept on the view across passes.
        settings = (config.method, tuple(config.las_thresholds_gpu_s), config.protocol_cost_s, config.preempt_ratio)
        for v in snapshot.running():
            level = every.get(v.priority_rank)
            if level is None or not (v.preemptible and v.placement):
                continue  # no job of its level waits, or it cannot be displaced
            kept = v.__dict__.get("_victim_entry")  # (settings, bar, key, sort key): no reference back to the view
            if kept is not None and kept[0] == settings:
                level.append((kept[3], kept[1], kept[2], v))
                continue
            key = keys.key(v)
            if las:
                bar = key  # strictly higher attained-service queue
            else:  # more than preempt_ratio times the waiting job's work, plus what the move costs
                left = key[0] if config.method == "shortest_remaining" else keys.remaining(v)
                bar = (left - config.protocol_cost_s * v.gpu_count) / ratio
            level.append(((key, v.gpu_count, v.id), bar, key, v))
            if not las and key[0] != key[0]:
                unordered.add(v.priority_rank)  # never kept on the view: seen here every pass
            elif las or v.step_time_s:
                object.__setattr__(v, "_victim_entry", (settings, bar, key, level[-1][0]))
        # Each level's victims furthest behind first: (key, devices, id), descending, the order a
        # waiting job takes them in. The sort key leads each entry and names one job, so the
        # entries sort by it alone without a key function. Left out: those `behind` stops before
        # for every waiting job of the level (not further behind than its least far behind one).
        self.by_rank: dict[int, list[tuple[tuple, float, tuple, JobView]]] = {}
        for rank, entries in every.items():
            low = least[rank]
            if low is not None and rank not in unordered:
                entries = [e for e in entries if e[2] > low] if las else [e for e in entries if e[2][0] / ratio > low]
            entries.sort(reverse=True)
            self.by_rank[rank] = entries

    def mine(self, waiting: JobView):
        """What a victim's key and bar are held against: the waiting job's own key (las) or remaining work."""
        known = self._mine.get(waiting.id)
        if known is None:
            if self.keys.config.method == "las":
                known = self.keys.key(waiting)
            else:
                known = self.keys.remaining(waiting)
            self._mine[waiting.id] = known
        return known

    def behind(self, waiting: JobView, taken: set[str], most: int | None = None) -> list[JobView]:
        """Running jobs of the waiting job's level that the order puts behind it, not yet taken,
        furthest behind first (key, then devices, then id, descending); the first `most` of them."""
        mine = self.mine(waiting)
        las = self.keys.config.method == "las"
        ratio = self.keys.config.preempt_ratio
        out = []
        for _, bar, key, v in self.by_rank.get(waiting.priority_rank, ()):
            # Keys only fall from here on, and a bar is never above its key (las: the key itself;
            # else key / preempt_ratio less the move's cost): once that is not above `mine`, no later one is.
            if (not key > mine) if las else (not key[0] / ratio > mine):
                break
            if bar > mine and v.id not in taken:
                out.append(v)
                if len(out) == most:
                    break
        return out


def decide(snapshot: Snapshot, config: QueueOrder) -> RuleOutput:
    if config.method == "fifo" or not config.preempt:
        return RuleOutput([])
    plan = plan_admission(snapshot)
    if not plan.waiting:
        return RuleOutput([])
    free = plan.free
    keys = Keys(config, snapshot.jobs)
    victims = _Victims(snapshot, keys, plan.waiting)
    taken: set[str] = set()
    room = _Room(free, snapshot)
    actions, pending = [], {}
    for job in plan.waiting:
        candidates = victims.behind(job, taken, config.max_victims)
        needed = room.first_fit(job, candidates)
        if not needed:
            continue  # not even all of them make room (the usual case in a backlog)
        chosen = candidates[:needed]
        for victim in sorted(chosen, key=lambda v: keys.key(v)):  # the nearest in the order is dropped first
            if len(chosen) > 1 and room.fits(job, [o for o in chosen if o is not victim]):
                chosen.remove(victim)
        for victim in chosen:
            taken.add(victim.id)
            free.release(victim.placement)
            actions.append(
                Preempt(
                    job_id=victim.id,
                    reason_code=ReasonCode.QUEUE_ORDER_PREEMPT,
                    reason=(
                        f"job {job.id} waits for {job.gpus} device(s) and comes before {victim.id} in the "
                        f"{config.method} order ({_describe(keys, job)} against {_describe(keys, victim)}): "
                        f"checkpoint and requeue {victim.id}"
                    ),
                    evidence={
                        "for_job": job.id,
                        "method": config.method,
                        "waiting_key": _key(keys, job),
                        "victim_key": _key(keys, victim),
                        "victim_gpus": victim.gpu_count,
                        "group": [v.id for v in chosen],
                    },
                )
            )
        fitted = place(job.gpus, free, snapshot.nodes, multi_node=job.multi_node)
        if fitted is not None:  # the freed devices are this job's
            free.book(fitted.placement)
        room.changed()  # devices released and booked: the kept counts are stale
        pending[job.id] = Reason(
            ReasonCode.PENDING_MAKING_ROOM, "making room for it: preempting " + ", ".join(v.id for v in chosen)
        )
    return RuleOutput(actions, pending)


class _Room:
    """Whether a waiting job would fit once a group of victims gave up their devices: what `place`
    would answer (it finds a placement exactly when the counts of free devices suffice), from the
    counts after releasing the group, kept per group until `free` changes (`changed`): the waiting
    jobs of a backlog mostly try the same groups, and most of them do not make room."""

    def __init__(self, free: FreeDevices, snapshot: Snapshot) -> None:
        self.free, self.nodes = free, snapshot.nodes
        self._counts: dict[tuple[str, ...], tuple[int, int]] = {}  # victims' ids -> (most on a node, total)
        self._prefixes: dict[tuple[str, ...], list[tuple[int, int]]] = {}  # victims' ids -> the counts of each prefix

    def first_fit(self, job: JobView, victims: list[JobView]) -> int:
        """How many of the victims, taken in order, make room for the job (the fewest); 0: not all of them."""
        if job.gpus <= 0:  # place's answers, not the counts': no shortcut
            if not victims or not self.fits(job, victims):
                return 0
            return next(k for k in range(1, len(victims) + 1) if self.fits(job, victims[:k]))
        if not victims:
            return 0
        group = tuple(v.id for v in victims)
        counts = self._prefixes.get(group)
        if counts is None:
            counts = self._prefixes[group] = self.free.counts_with_each(self.nodes, [v.placement for v in victims])
        if not counts_fit(job.gpus, counts[-1], multi_node=job.multi_node):
            return 0  # the counts only grow along the group: not even all of them (the usual case)
        return next(k for k, c in enumerate(counts, start=1) if counts_fit(job.gpus, c, multi_node=job.multi_node))

    def fits(self, job: JobView, victims: list[JobView]) -> bool:
        if job.gpus <= 0:  # place's answer for nothing asked is not the counts'
            trial = self.free.copy()
            for victim in victims:
                trial.release(victim.placement)
            return place(job.gpus, trial, self.nodes, multi_node=job.multi_node) is not None
        group = tuple(v.id for v in victims)
        counts = self._counts.get(group)
        if counts is None:
            counts = self._counts[group] = self.free.counts_with(self.nodes, [v.placement for v in victims])
        return counts_fit(job.gpus, counts, multi_node=job.multi_node)

    def changed(self) -> None:
        self._counts.clear()
        self._prefixes.clear()


def _key(keys: Keys, job: JobView) -> list:
    return [(None if k == float("inf") else round(k, 1)) if isinstance(k, float) else k for k in keys.key(job)]


def _describe(keys: Keys, job: JobView) -> str:
    if keys.config.method == "las":
        return f"attained-service queue {keys.key(job)[0]}"
    est = keys.key(job)[0]
    return "remaining work unknown" if est == float("inf") else f"about {est / 3600:.2f} GPU-hours left"


RULE = Rule(
    name=NAME,
    decide=decide,
    config=QueueOrder,
    precedence=45,
    description="admission order inside a level (fifo, las, shortest_remaining); a waiting job displaces later ones",
)
