"""Where a job's devices go: gang, topology-aware placement, and the admission plan every
queue-related rule replays.

Placement is all or nothing. Among the ways a job fits, tighter topology wins: one NVLink
domain, then one NUMA node, then one node, then one rack; between equally tight choices, best
fit (the node left with the fewest free devices), which keeps large holes for large jobs.
A job that allows multi-node may aggregate fragments: free devices on several nodes, the
fewest nodes possible, within one rack when one rack has room; without fragment aggregation
it spans only whole free nodes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from services.decider.snapshot import JobView, NodeView, Snapshot
from shared.actions import NodeGpus
from shared.quota import TeamUsage, over_quota

Eligible = Callable[[str, int], bool]


@dataclass(frozen=True)
class Choice:
    """A placement and how tight it is (smaller is tighter)."""

    placement: tuple[NodeGpus, ...]
    racks: int
    nodes: int
    domains: int
    numa: int
    leftover: int  # free devices left on the chosen nodes

    @property
    def score(self) -> tuple:
        return (self.racks, self.nodes, self.domains, self.numa, self.leftover,
                tuple(p.node for p in self.placement))

    def describe(self) -> str:
        if self.nodes == 1:
            where = "one NVLink domain" if self.domains == 1 else f"{self.domains} NVLink domains"
            return f"{where} on {self.placement[0].node}"
        return f"{self.nodes} nodes in {self.racks} rack(s)"

    def evidence(self) -> dict:
        return {"racks": self.racks, "nodes": self.nodes, "nvlink_domains": self.domains, "numa_nodes": self.numa}


class FreeDevices:
    """Free devices per schedulable node during one pass; booking takes them away."""

    def __init__(self, free: dict[str, list[int]]) -> None:
        self.free = {n: sorted(devs) for n, devs in free.items()}

    @classmethod
    def of(cls, snapshot: Snapshot) -> "FreeDevices":
        base = snapshot._memo.get("free")
        if base is None:  # once per snapshot; every caller books into its own copy
            base = snapshot._memo["free"] = cls({n.id: list(n.free) for n in snapshot.nodes.values() if n.schedulable})
        return base.copy()

    def copy(self) -> "FreeDevices":
        copied = FreeDevices.__new__(FreeDevices)
        copied.free = {n: list(d) for n, d in self.free.items()}  # already sorted
        return copied

    def book(self, placement: Iterable[NodeGpus]) -> None:
        for part in placement:
            left = self.free.get(part.node, [])
            self.free[part.node] = [g for g in left if g not in part.gpus]

    def release(self, placement: Iterable[NodeGpus]) -> None:
        """Count these devices as free (a job that would leave them), where the node is schedulable."""
        for part in placement:
            if part.node in self.free:
                self.free[part.node] = sorted(set(self.free[part.node]) | set(part.gpus))

    def count(self, node: str) -> int:
        return len(self.free.get(node, ()))

    def total(self) -> int:
        return sum(len(d) for d in self.free.values())

    def most(self) -> tuple[str | None, int]:
        return max(((n, len(d)) for n, d in self.free.items()), key=lambda kv: (kv[1], kv[0]), default=(None, 0))


def _by_domain(node: NodeView, gpus: list[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for g in gpus:
        groups.setdefault(node.gpu(g).nvlink_domain, []).append(g)
    return groups


def _pick_on_node(node: NodeView, gpus: list[int], n: int) -> tuple[list[int], int, int]:
    """n devices out of `gpus`: inside one NVLink domain if one has room (the fullest such), else the
    fewest domains. Returns (devices, domains used, NUMA nodes used)."""
    groups = _by_domain(node, gpus)
    fitting = [(len(devs), d) for d, devs in groups.items() if len(devs) >= n]
    if fitting:
        _, domain = min(fitting)
        chosen = sorted(groups[domain])[:n]
    else:
        chosen = []
        for _, domain in sorted(((len(devs), d) for d, devs in groups.items()), reverse=True):
            chosen += sorted(groups[domain])[: n - len(chosen)]
            if len(chosen) == n:
                break
    domains = len({node.gpu(g).nvlink_domain for g in chosen})
    numa = len({node.gpu(g).numa_node for g in chosen})
    return sorted(chosen), domains, numa


def place(n: int, free: FreeDevices, nodes: dict[str, NodeView], *, multi_node: bool = False,
          eligible: Eligible | None = None, exclude: Iterable[str] = (), whole_nodes: bool = False) -> Choice | None:
    """The tightest placement of `n` devices on `free`, or None. `eligible` filters devices
    (e.g. same GPU model, enough free memory); nodes in `exclude` are not used. With
    `whole_nodes`, a job spanning nodes takes only nodes it has to itself (no fragments)."""
    excluded = set(exclude)
    usable: dict[str, list[int]] = {}
    for name, devs in free.free.items():
        node = nodes.get(name)
        if node is None or name in excluded or not node.schedulable:
            continue
        ok = [g for g in devs if eligible is None or eligible(name, g)]
        if ok:
            usable[name] = ok
    best: Choice | None = None
    for name, devs in usable.items():
        if len(devs) < n:
            continue
        chosen, domains, numa = _pick_on_node(nodes[name], devs, n)
        choice = Choice((NodeGpus(node=name, gpus=tuple(chosen)),), 1, 1, domains, numa, len(free.free[name]) - n)
        if best is None or choice.score < best.score:
            best = choice
    if best is not None or not multi_node or n <= 0:
        return best
    if whole_nodes:
        usable = {name: devs for name, devs in usable.items() if len(devs) == len(nodes[name].devices)}
    return _aggregate(n, usable, free, nodes)


def _aggregate(n: int, usable: dict[str, list[int]], free: FreeDevices, nodes: dict[str, NodeView]) -> Choice | None:
    """Fragments on several nodes: the fewest nodes, inside one rack when one rack has room."""
    if sum(len(d) for d in usable.values()) < n:
        return None
    racks: dict[str, list[str]] = {}
    for name in usable:
        racks.setdefault(nodes[name].rack, []).append(name)

    def greedy(names: list[str]) -> list[str] | None:
        taken, count = [], 0
        for name in sorted(names, key=lambda x: (-len(usable[x]), x)):
            taken.append(name)
            count += len(usable[name])
            if count >= n:
                return taken
        return None

    options = [t for t in (greedy(names) for names in racks.values()) if t]
    if not options:
        options = [greedy(list(usable))]
    picked = min(options, key=lambda t: (len(t), sum(len(usable[x]) for x in t), t))
    parts, need, domains, numa = [], n, 0, 0
    for name in picked:
        take = min(need, len(usable[name]))
        chosen, d, u = _pick_on_node(nodes[name], usable[name], take)
        parts.append(NodeGpus(node=name, gpus=tuple(chosen)))
        need -= take
        domains, numa = domains + d, numa + u
    leftover = sum(len(free.free[p.node]) - len(p.gpus) for p in parts)
    return Choice(tuple(parts), len({nodes[p.node].rack for p in parts}), len(parts), domains, numa, leftover)


def tightness(placement: Iterable[NodeGpus], nodes: dict[str, NodeView]) -> tuple[int, int, int]:
    """(racks, nodes, NVLink domains) an existing placement spans."""
    parts = list(placement)
    racks = {nodes[p.node].rack if p.node in nodes else p.node for p in parts}
    domains = {(p.node, nodes[p.node].gpu(g).nvlink_domain if p.node in nodes else 0) for p in parts for g in p.gpus}
    return len(racks), len(parts), len(domains)


def fits_anywhere(job: JobView, snapshot: Snapshot) -> bool:
    """Whether the job could fit at all on the schedulable cluster if it were empty."""
    sizes = [len(n.devices) for n in snapshot.nodes.values() if n.schedulable]
    return job.gpus <= (sum(sizes) if job.multi_node else max(sizes, default=0))


# --- admission -------------------------------------------------------------------------

@dataclass(frozen=True)
class Admitted:
    job: JobView
    choice: Choice
    position: int
    free_before: dict[str, int]


@dataclass
class AdmissionPlan:
    """The queue replayed in admission order over the free devices."""

    admitted: list[Admitted] = field(default_factory=list)
    waiting: list[JobView] = field(default_factory=list)   # do not fit now; making room would help
    reasons: dict[str, str] = field(default_factory=dict)  # every job left pending, and why
    free: FreeDevices = field(default_factory=lambda: FreeDevices({}))


def plan_admission(snapshot: Snapshot, *, backfill: str = "within_level", aggregate_fragments: bool = True) -> AdmissionPlan:
    """Admit pending jobs in the snapshot's queue order (priority level first), gang, topology-aware.

    Several rules replay the same plan over the same snapshot: it is computed once per snapshot
    and each caller gets its own copy to book into.
    """
    key = ("plan_admission", backfill, aggregate_fragments)
    plan = snapshot._memo.get(key)
    if plan is None:
        plan = _plan_admission(snapshot, backfill, aggregate_fragments)
        snapshot._memo[key] = plan
    return AdmissionPlan(list(plan.admitted), list(plan.waiting), dict(plan.reasons), plan.free.copy())


def _plan_admission(snapshot: Snapshot, backfill: str, aggregate_fragments: bool) -> AdmissionPlan:
    """Admit pending jobs in priority order, then queue order (FIFO by default), gang, topology-aware.

    A job that does not fit does not block smaller jobs of its own level behind it (backfill);
    with backfill="within_level" it does hold back jobs of lower levels, so the devices that
    free up go to it first. A team over its quota waits with the quota's reason.
    """
    plan = AdmissionPlan(free=FreeDevices.of(snapshot))
    usage = snapshot.team_usage()
    blocking_rank: int | None = None
    for position, job in enumerate(snapshot.pending(), start=1):
        quota_reason = over_quota(snapshot.quotas.get(job.team), usage.get(job.team, TeamUsage()), job.gpus)
        if quota_reason:
            plan.reasons[job.id] = f"over quota: {quota_reason}"
            continue
        if backfill == "within_level" and blocking_rank is not None and job.priority_rank > blocking_rank:
            head = next(w for w in plan.waiting if w.priority_rank == blocking_rank)
            plan.reasons[job.id] = (f"held behind higher-priority job {head.id} ({head.priority}), "
                                    f"which waits for {head.gpus} device(s)")
            continue
        before = {n: len(d) for n, d in plan.free.free.items()}
        choice = place(job.gpus, plan.free, snapshot.nodes, multi_node=job.multi_node,
                       whole_nodes=not aggregate_fragments)
        if choice is None:
            most_node, most = plan.free.most()
            plan.reasons[job.id] = (f"no node has {job.gpus} free device(s) (most free: {most_node} with {most})"
                                    if snapshot.nodes else "no nodes are registered")
            if fits_anywhere(job, snapshot):
                plan.waiting.append(job)
                if blocking_rank is None:
                    blocking_rank = job.priority_rank
            elif snapshot.nodes:
                plan.reasons[job.id] += "; it needs more devices than any schedulable node has"
            continue
        plan.free.book(choice.placement)
        u = usage.get(job.team, TeamUsage())
        usage[job.team] = TeamUsage(gpus=u.gpus + job.gpus, running_jobs=u.running_jobs + 1)
        plan.admitted.append(Admitted(job, choice, position, before))
    return plan
