"""Where a job's devices go: gang, topology-aware placement on the free devices.

Placement is all or nothing. Among the ways a job fits, tighter topology wins: one NVLink
domain, then one NUMA node, then one node, then one rack; between equally tight choices, best
fit (the node left with the fewest free devices), which keeps large holes for large jobs.
A job that allows multi-node may aggregate fragments: free devices on several nodes, the
fewest nodes possible, within one rack when one rack has room; without fragment aggregation
it spans only whole free nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.decider.free_devices import FreeDevices
from services.decider.snapshot import JobView, NodeView, Snapshot
from shared.contracts.actions import NodeGpus

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
        return (self.racks, self.nodes, self.domains, self.numa, self.leftover, tuple(p.node for p in self.placement))

    def describe(self) -> str:
        if self.nodes == 1:
            where = "one NVLink domain" if self.domains == 1 else f"{self.domains} NVLink domains"
            return f"{where} on {self.placement[0].node}"
        return f"{self.nodes} nodes in {self.racks} rack(s)"

    def evidence(self) -> dict:
        return {"racks": self.racks, "nodes": self.nodes, "nvlink_domains": self.domains, "numa_nodes": self.numa}


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


def place(
    n: int,
    free: FreeDevices,
    nodes: dict[str, NodeView],
    *,
    multi_node: bool = False,
    eligible: Eligible | None = None,
    exclude: Iterable[str] = (),
    whole_nodes: bool = False,
) -> Choice | None:
    """The tightest placement of `n` devices on `free`, or None. `eligible` filters devices
    (e.g. same GPU model, enough free memory); nodes in `exclude` are not used. With
    `whole_nodes`, a job spanning nodes takes only nodes it has to itself (no fragments)."""
    if (
        eligible is None
        and not exclude
        and n > 0
        and not free.fits(n, nodes, multi_node=multi_node, whole_nodes=whole_nodes)
    ):
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


def merged(placement: Iterable[NodeGpus], extra: Iterable[NodeGpus]) -> list[NodeGpus]:
    """`placement` with the devices of `extra` added, one part per node."""
    by_node = {p.node: list(p.gpus) for p in placement}
    for p in extra:
        by_node.setdefault(p.node, []).extend(p.gpus)
    return [NodeGpus(node=n, gpus=tuple(sorted(g))) for n, g in by_node.items()]


def without(placement: Iterable[NodeGpus], removed: Iterable[NodeGpus]) -> list[NodeGpus]:
    """The devices of `placement` that are not among `removed`, per node (nodes left empty dropped)."""
    gone = {(p.node, g) for p in removed for g in p.gpus}
    parts = [
        NodeGpus.model_construct(node=p.node, gpus=tuple(g for g in p.gpus if (p.node, g) not in gone))
        for p in placement
    ]
    return [p for p in parts if p.gpus]


def fits_anywhere(job: JobView, snapshot: Snapshot) -> bool:
    """Whether the job could fit at all on the schedulable cluster if it were empty."""
    sizes = snapshot._memo.get("node_sizes")
    if sizes is None:  # once per snapshot: admission asks for every job that waits
        each = [len(n.devices) for n in snapshot.nodes.values() if n.schedulable]
        sizes = snapshot._memo["node_sizes"] = (sum(each), max(each, default=0))
    return job.gpus <= (sizes[0] if job.multi_node else sizes[1])
