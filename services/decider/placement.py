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
    """Free devices per schedulable node during one pass; booking takes them away.

    Each node's devices are a sorted tuple, never changed in place (booking and releasing put new
    ones), so a copy shares them: copying costs a dict of the nodes, not their devices. Change
    `free` only through `book`, `release` or by assigning it whole: the summaries that let
    `place` answer "does not fit" without a scan (most free on one node, free in all, free on
    whole nodes) and `most()` are kept until the next change."""

    __slots__ = ("_free", "_counts", "_most", "_total")

    def __init__(self, free: dict[str, Iterable[int]]) -> None:
        self._free = {n: tuple(sorted(devs)) for n, devs in free.items()}
        self._forget()

    def _forget(self) -> None:
        self._counts: tuple | None = None  # (nodes, most on one node, total, total on whole free nodes)
        self._most: tuple[str | None, int] | None = None
        self._total: int | None = None

    @property
    def free(self) -> dict[str, tuple[int, ...]]:
        return self._free

    @free.setter
    def free(self, value: dict[str, Iterable[int]]) -> None:
        self._free = {n: d if isinstance(d, tuple) else tuple(d) for n, d in value.items()}
        self._forget()

    @classmethod
    def of(cls, snapshot: Snapshot) -> "FreeDevices":
        base = snapshot._memo.get("free")
        if base is None:  # once per snapshot; every caller books into its own copy
            base = snapshot._memo["free"] = cls.from_sorted({n.id: n.free_sorted for n in snapshot.nodes.values()
                                                              if n.schedulable})  # sorted once per node view
        return base.copy()

    @classmethod
    def from_sorted(cls, free: dict[str, tuple[int, ...]]) -> "FreeDevices":
        """From devices already in sorted tuples (the constructor sorts them); `free` is copied."""
        made = cls.__new__(cls)
        made._free = dict(free)
        made._forget()
        return made

    def copy(self) -> "FreeDevices":
        copied = FreeDevices.__new__(FreeDevices)
        copied._free = dict(self._free)  # the tuples are shared: nobody changes them in place
        copied._counts, copied._most, copied._total = self._counts, self._most, self._total
        return copied

    def book(self, placement: Iterable[NodeGpus]) -> None:
        for part in placement:
            left = self._free.get(part.node)
            now = tuple(g for g in left if g not in part.gpus) if left else ()
            self._free[part.node] = now
            if left is None:
                self._most = None  # a new (empty) entry can still be the most when nothing is free
            elif len(now) != len(left):
                self._most = None
                if self._total is not None:
                    self._total -= len(left) - len(now)
                counts = self._counts
                if counts is not None:  # fewer free: kept without a scan unless the most on one node may fall
                    nodes, most, total, whole = counts
                    node = nodes.get(part.node)
                    if node is not None and node.schedulable:
                        if len(left) >= most:
                            self._counts = None
                        else:
                            size = len(node.devices)
                            whole -= (len(left) if len(left) == size else 0) - (len(now) if len(now) == size else 0)
                            self._counts = (nodes, most, total - (len(left) - len(now)), whole)

    def release(self, placement: Iterable[NodeGpus]) -> None:
        """Count these devices as free (a job that would leave them), where the node is schedulable."""
        for part in placement:
            left = self._free.get(part.node)
            if left is None:
                continue
            now = tuple(sorted(set(left) | set(part.gpus)))
            self._free[part.node] = now
            delta = len(now) - len(left)
            if not delta:
                continue  # nothing it did not have
            self._most = None
            if self._total is not None:
                self._total += delta
            counts = self._counts
            if counts is not None:  # more free: the summary only grows, no scan needed
                nodes, most, total, whole = counts
                node = nodes.get(part.node)
                if node is not None and node.schedulable:
                    size = len(node.devices)
                    whole += (len(now) if len(now) == size else 0) - (len(left) if len(left) == size else 0)
                    self._counts = (nodes, max(most, len(now)), total + delta, whole)

    def count(self, node: str) -> int:
        return len(self._free.get(node, ()))

    def total(self) -> int:
        if self._total is None:
            self._total = sum(len(d) for d in self._free.values())
        return self._total

    def most(self) -> tuple[str | None, int]:
        if self._most is None:  # the most free, then the last name (names are unique: no ties)
            count, name = max(((len(d), n) for n, d in self._free.items()), default=(0, None))
            self._most = (name, count)
        return self._most

    def _summary(self, nodes: dict[str, NodeView]) -> tuple:
        counts = self._counts
        if counts is None or counts[0] is not nodes:
            most = total = whole = 0
            for name, devs in self._free.items():
                k = len(devs)
                if not k:
                    continue
                node = nodes.get(name)
                if node is None or not node.schedulable:
                    continue
                total += k
                most = max(most, k)
                if k == len(node.devices):
                    whole += k
            counts = self._counts = (nodes, most, total, whole)
        return counts

    def fits(self, n: int, nodes: dict[str, NodeView], *, multi_node: bool = False, whole_nodes: bool = False) -> bool:
        """Whether `place(n, self, nodes, multi_node=..., whole_nodes=...)` (no filter, nothing
        excluded) finds a placement, without building it."""
        _, most, total, whole = self._summary(nodes)
        if n <= 0:
            return total > 0
        return most >= n or (multi_node and (whole if whole_nodes else total) >= n)

    def counts_with(self, nodes: dict[str, NodeView], released: Iterable[Iterable[NodeGpus]]) -> tuple[int, int]:
        """(most free on one node, free in all) as `fits` counts them, after `release` of each of the
        `released` placements, without making the copy (rules try many groups of jobs to displace,
        most of which do not make room). `counts_fit` answers from them as `fits` would."""
        each = self.counts_with_each(nodes, released)
        return each[-1] if each else self._summary(nodes)[1:3]

    def counts_with_each(self, nodes: dict[str, NodeView], released: Iterable[Iterable[NodeGpus]]) -> list[tuple[int, int]]:
        """`counts_with` after releasing the first placement of `released`, the first two, and so on:
        one sweep (releasing only adds free devices, so the counts only grow along it)."""
        _, most, total, _ = self._summary(nodes)
        freed: dict[str, set[int]] = {}  # per node touched: its free devices with those released so far
        out = []
        for placement in released:
            for part in placement:
                left = self._free.get(part.node)
                if left is None:
                    continue
                node = nodes.get(part.node)
                if node is None or not node.schedulable:
                    continue  # not counted by the summary either
                now = freed.get(part.node)
                if now is None:
                    now = freed[part.node] = set(left)
                before = len(now)
                now.update(part.gpus)
                most, total = max(most, len(now)), total + len(now) - before
            out.append((most, total))
        return out


def counts_fit(n: int, counts: tuple[int, int], *, multi_node: bool = False) -> bool:
    """What `fits(n, ...)` answers for n >= 1 devices, from (most free on one node, free in all)."""
    most, total = counts
    return most >= n or (multi_node and total >= n)


def _by_domain(node: NodeView, gpus) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for g in gpus:
        groups.setdefault(node.gpu(g).nvlink_domain, []).append(g)
    return groups


def _pick_on_node(node: NodeView, gpus, n: int) -> tuple[tuple[int, ...], int, int]:
    """n devices out of `gpus`: inside one NVLink domain if one has room (the fullest such), else the
    fewest domains. Returns (devices, domains used, NUMA nodes used). Kept on the node's view (its
    devices' topology never changes), so the same question is answered once."""
    picks = node.__dict__.get("_picks")
    if picks is None:
        picks = {}
        object.__setattr__(node, "_picks", picks)
    key = (tuple(gpus), n)
    known = picks.get(key)
    if known is None:
        known = picks[key] = _pick(node, gpus, n)
    return known


def _pick(node: NodeView, gpus, n: int) -> tuple[tuple[int, ...], int, int]:
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
    return tuple(sorted(chosen)), domains, numa


def place(n: int, free: FreeDevices, nodes: dict[str, NodeView], *, multi_node: bool = False,
          eligible: Eligible | None = None, exclude: Iterable[str] = (), whole_nodes: bool = False) -> Choice | None:
    """The tightest placement of `n` devices on `free`, or None. `eligible` filters devices
    (e.g. same GPU model, enough free memory); nodes in `exclude` are not used. With
    `whole_nodes`, a job spanning nodes takes only nodes it has to itself (no fragments)."""
    if eligible is None and not exclude and n > 0 and not free.fits(n, nodes, multi_node=multi_node,
                                                                    whole_nodes=whole_nodes):
        return None  # what the search below would find, from the summary of free devices
    excluded = set(exclude)
    best, best_key = None, None
    for name, devs in free.free.items():
        if len(devs) < n:
            continue
        # A pick of n >= 1 devices spans at least one domain and one NUMA node: once the best is that
        # tight, a node that would leave more devices over cannot beat it (its key is larger).
        if best_key is not None and best_key[0] == 1 and best_key[1] == 1 and len(devs) - n > best_key[2] and n > 0:
            continue
        node = nodes.get(name)
        if node is None or name in excluded or not node.schedulable:
            continue
        ok = devs if eligible is None else [g for g in devs if eligible(name, g)]
        if not ok or len(ok) < n:
            continue
        chosen, domains, numa = _pick_on_node(node, ok, n)
        key = (domains, numa, len(devs) - n, name)  # Choice.score of a one-node choice, past its (1, 1)
        if best_key is None or key < best_key:
            best, best_key = (name, chosen, domains, numa, len(devs) - n), key
    if best is not None:
        name, chosen, domains, numa, leftover = best
        # A node name and a tuple of its device indexes: valid as built, so not validated again.
        return Choice((NodeGpus.model_construct(node=name, gpus=chosen),), 1, 1, domains, numa, leftover)
    if not multi_node or n <= 0:
        return None
    usable: dict[str, list[int]] = {}
    for name, devs in free.free.items():
        node = nodes.get(name)
        if node is None or name in excluded or not node.schedulable:
            continue
        ok = list(devs) if eligible is None else [g for g in devs if eligible(name, g)]
        if ok:
            usable[name] = ok
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
        parts.append(NodeGpus.model_construct(node=name, gpus=tuple(chosen)))  # valid as built (see place)
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
    sizes = snapshot._memo.get("node_sizes")
    if sizes is None:  # once per snapshot: admission asks for every job that waits
        each = [len(n.devices) for n in snapshot.nodes.values() if n.schedulable]
        sizes = snapshot._memo["node_sizes"] = (sum(each), max(each, default=0))
    return job.gpus <= (sizes[0] if job.multi_node else sizes[1])


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
    quotas = bool(snapshot.quotas)  # without any, nobody is over one: usage is not worth counting
    usage = snapshot.team_usage() if quotas else {}
    users = snapshot.user_usage() if quotas else {}
    blocking_rank: int | None = None
    # Whether a job fits, and its reason, rest on its size and multi_node alone while nothing is booked:
    # a size that did not fit is not placed again until the next booking (most of a backlog waits), which
    # changes the reason's "most free".
    unfit: dict[tuple[int, bool], tuple[str, bool]] = {}  # (gpus, multi_node) -> (its reason, fits_anywhere)
    for position, job in enumerate(snapshot.pending(), start=1):
        quota_reason = over_quota(snapshot.quotas.get(job.team), usage.get(job.team, TeamUsage()), job.gpus,
                                  job.owner, users.get((job.team, job.owner), TeamUsage())) if quotas else None
        if quota_reason:
            plan.reasons[job.id] = f"over quota: {quota_reason}"
            continue
        if backfill == "within_level" and blocking_rank is not None and job.priority_rank > blocking_rank:
            head = next(w for w in plan.waiting if w.priority_rank == blocking_rank)
            plan.reasons[job.id] = (f"held behind higher-priority job {head.id} ({head.priority}), "
                                    f"which waits for {head.gpus} device(s)")
            continue
        size = (job.gpus, job.multi_node)
        known = unfit.get(size)
        if known is None:
            choice = place(job.gpus, plan.free, snapshot.nodes, multi_node=job.multi_node,
                           whole_nodes=not aggregate_fragments)
            if choice is None:
                most_node, most = plan.free.most()
                reason = (f"no node has {job.gpus} free device(s) (most free: {most_node} with {most})"
                          if snapshot.nodes else "no nodes are registered")
                anywhere = fits_anywhere(job, snapshot)
                if not anywhere and snapshot.nodes:
                    reason += "; it needs more devices than any schedulable node has"
                known = unfit[size] = (reason, anywhere)
        if known is not None:
            plan.reasons[job.id], anywhere = known
            if anywhere:
                plan.waiting.append(job)
                if blocking_rank is None:
                    blocking_rank = job.priority_rank
            continue
        before = {n: len(d) for n, d in plan.free.free.items()}  # placing takes nothing: as it was before
        plan.free.book(choice.placement)
        unfit.clear()
        plan.admitted.append(Admitted(job, choice, position, before))
        if not quotas:
            continue
        u = usage.get(job.team, TeamUsage())
        usage[job.team] = TeamUsage(gpus=u.gpus + job.gpus, running_jobs=u.running_jobs + 1)
        u = users.get((job.team, job.owner), TeamUsage())
        users[(job.team, job.owner)] = TeamUsage(gpus=u.gpus + job.gpus, running_jobs=u.running_jobs + 1)
    return plan
