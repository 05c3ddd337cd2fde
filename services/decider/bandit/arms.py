"""Decision point 1, placement: the feasible device sets a start may take, and their features.

The rules' own placement is always arm 0. The others are the same number of devices, on one
node each, picked by the same in-node placement (`placement._pick_on_node`: one NVLink domain when
one has room), from devices that are free in the snapshot and that no other proposal of the pass
takes, of the same GPU model and memory as the rules' pick. So every arm keeps the rules' hard
constraints: gang size, free and unbooked devices, schedulable nodes, the device type.
Between nodes that look the same (free devices, NVLink domains, NUMA nodes) one is kept; the
arms are spread from the fullest such node (the rules' best fit) to the emptiest.

An arm that takes devices from a roomier node than the rules' pick while a larger one-node job
waits, leaving that node fewer free devices than the waiting job needs, pushes the waiting job
back: `blocked` is that job's device count (the reward charges it, policy.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.decider.free_devices import FreeDevices
from services.decider.placement import _pick_on_node
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import NodeGpus

Taken = set[tuple[str, int]]


@dataclass(frozen=True)
class Arm:
    placement: tuple[NodeGpus, ...]
    features: dict[str, float]
    blocked: int = 0  # devices of the waiting job this arm pushes back (0 for the rules' own pick)


def job_features(job: JobView, snapshot: Snapshot, waiting: int = 0) -> dict[str, float]:
    """What the bandit knows of the job and the cluster when it chooses (the shared context);
    `waiting` is the largest one-node gang the pass leaves waiting (`waiting_gang`)."""
    free_share = _free_share(snapshot)
    features = {
        "log2_waiting_gang": math.log2(1 + waiting),
        "log2_gpus": math.log2(max(1, job.gpus)),
        "elastic": float(job.elastic),
        "multi_node": float(job.multi_node),
        "priority_rank": float(job.priority_rank),
        "resumed": float(job.attempt > 0),
        "cluster_free": free_share,
    }
    if job.step_time_s:
        features["log_step_s"] = math.log(max(job.step_time_s, 1e-3))
    if job.micro_batch:
        features["log2_micro_batch"] = math.log2(job.micro_batch)
    return features


def waiting_gang(snapshot: Snapshot, starting: set[str]) -> int:
    """The devices of the largest pending job that fits one node and that no proposal of the pass
    starts: the job a spread placement would keep waiting longer."""
    largest = max((len(n.devices) for n in snapshot.nodes.values() if n.schedulable), default=0)
    sizes = [j.gpus for j in snapshot.pending() if j.id not in starting and j.gpus <= largest]
    return max(sizes, default=0)


def _free_share(snapshot: Snapshot) -> float:
    share = snapshot._memo.get("bandit_free_share")
    if share is None:
        total = sum(len(n.devices) for n in snapshot.nodes.values() if n.schedulable)
        free = sum(len(n.free) for n in snapshot.nodes.values() if n.schedulable)
        share = snapshot._memo["bandit_free_share"] = free / total if total else 0.0
    return share


def node_feature(node_id: str) -> str:
    """The name of the feature that says an arm is on this node."""
    return f"node_{node_id}"


def _features(snapshot: Snapshot, node_id: str, free_left: int, n: int, domains: int, numa: int, chosen=()):
    node = snapshot.nodes[node_id]
    size = max(1, len(node.devices))
    features = {
        "neighbours": (size - free_left) / size,  # devices others hold on the node (co-location)
        "left_after": (free_left - n) / size,  # free devices left on the node after this start
        "numa_span": float(numa - 1),
        "nvlink_span": float(domains - 1),
        "gang_share": n / size,
        # The node itself: what no other feature shows of it (a node slower than its peers for a cause
        # telemetry does not name) is learned from the rewards of the starts placed on it.
        node_feature(node_id): 1.0,
    }
    headroom = _memory_headroom(snapshot, node_id, chosen)
    if headroom is not None:
        features["memory_headroom"] = headroom
    return features


def _memory_headroom(snapshot: Snapshot, node_id: str, gpus) -> float | None:
    """The smallest free memory share among the arm's devices, from their latest readings (none
    when the node has not reported: the simulator samples memory only during spikes)."""
    telemetry = snapshot.telemetry
    if telemetry is None:
        return None
    shares = []
    for g in gpus:
        reading = telemetry.gpu_latest(node_id, g)
        if reading is not None and reading.total_bytes > 0 and reading.age_s <= telemetry.stale_after_s:
            shares.append(1.0 - reading.fraction)
    return min(shares) if shares else None


def _charge(arm: Arm, rules_free: int, free_count: int, n: int, waiting: int) -> Arm:
    """The arm with its `blocked` devices: a roomier node than the rules' pick left too small for
    the waiting job."""
    blocked = waiting if free_count > rules_free and free_count - n < waiting else 0
    return Arm(arm.placement, arm.features | {"log2_blocked": math.log2(1 + blocked)}, blocked)


def placement_arms(
    job: JobView,
    rules_pick: tuple[NodeGpus, ...],
    snapshot: Snapshot,
    taken: Taken,
    max_arms: int,
    keep_idle_nodes: bool = True,
    waiting: int = 0,
):
    """The arms of a one-node start: the rules' pick first, then up to `max_arms - 1` others;
    None when the start is not one the bandit chooses for (it spans nodes, or no other set fits).
    With `keep_idle_nodes`, a node nobody holds a device of is an arm only if the rules' pick is
    one: the whole nodes the rules' best fit keeps for large jobs stay whole."""
    if len(rules_pick) != 1 or max_arms < 2:
        return None
    part = rules_pick[0]
    node = snapshot.nodes.get(part.node)
    if node is None:
        return None
    n = len(part.gpus)
    kind = {(node.gpu(g).model, node.gpu(g).memory_total_bytes) for g in part.gpus}
    if len(kind) != 1:
        return None
    model, memory = next(iter(kind))
    free = _free(snapshot)
    own = set(part.gpus)
    rules_free = [g for g in free.get(part.node, ()) if (part.node, g) not in taken or g in own]
    domains, numa = _span(node, part.gpus)
    features = _features(snapshot, part.node, len(rules_free), n, domains, numa, part.gpus)
    arms = [Arm(rules_pick, features | {"log2_blocked": 0.0})]
    spare_idle = keep_idle_nodes and len(node.free) < len(node.devices)
    seen = {(len(rules_free), domains, numa)}
    options: dict[tuple[int, int, int], tuple[str, tuple[int, ...]]] = {}
    touched = {name for name, _ in taken}
    # Nodes no proposal of the pass takes from, by how many usable devices they have free (once per
    # snapshot); the first of each count by name stands for them.
    for (count, idle), names in _shapes(snapshot, model, memory, n).items():
        if spare_idle and idle:
            continue
        found = next(((x, ok) for x, ok in names if x != part.node and x not in touched), None)
        if found is None:
            continue
        chosen, d, u = _pick_on_node(snapshot.nodes[found[0]], found[1], n)
        if (count, d, u) not in seen:
            options[(count, d, u)] = (found[0], chosen)
    for name in touched:  # and the few that lost devices to this pass's proposals, one by one
        devs, other = free.get(name, ()), snapshot.nodes.get(name)
        if name == part.node or other is None or not other.schedulable or len(devs) < n:
            continue
        if spare_idle and len(other.free) == len(other.devices):
            continue
        ok = [g for g in devs if (name, g) not in taken and _kind(other, g) == (model, memory)]
        if len(ok) < n:
            continue
        chosen, d, u = _pick_on_node(other, ok, n)
        key = (len(ok), d, u)
        if key in seen or (key in options and options[key][0] < name):
            continue
        options[key] = (name, chosen)
    # Spread over how full the candidate nodes are: the fullest (tightest fit) to the emptiest.
    ordered = sorted(options.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))
    picks = _spread(ordered, max_arms - 1)
    for (free_count, d, u), (name, chosen) in picks:
        placement = (NodeGpus.model_construct(node=name, gpus=tuple(chosen)),)
        arm = Arm(placement, _features(snapshot, name, free_count, n, d, u, chosen))
        arms.append(_charge(arm, len(rules_free), free_count, n, waiting))
    return arms if len(arms) > 1 else None


def _free(snapshot: Snapshot) -> dict[str, tuple[int, ...]]:
    free = snapshot._memo.get("bandit_free")
    if free is None:
        free = snapshot._memo["bandit_free"] = FreeDevices.of(snapshot).free
    return free


def _kind(node, g: int) -> tuple[str, int]:
    info = node.gpu(g)
    return info.model, info.memory_total_bytes


def _kinds(node) -> frozenset[tuple[str, int]]:
    """The kinds of device a node has; kept on its view (its devices never change)."""
    kinds = node.__dict__.get("_bandit_kinds")
    if kinds is None:
        kinds = frozenset(_kind(node, g) for g in node.devices)
        object.__setattr__(node, "_bandit_kinds", kinds)
    return kinds


def _shapes(snapshot: Snapshot, model: str, memory: int, n: int) -> dict[tuple, list[tuple[str, tuple[int, ...]]]]:
    """(usable free devices, idle) -> the nodes with that many usable devices free, with those
    devices, by name, for starts of `n` devices of this kind: once per snapshot and size."""
    memo = snapshot._memo.setdefault("bandit_shapes", {})
    shapes = memo.get((model, memory, n))
    if shapes is None:
        shapes = {}
        for name, devs in _free(snapshot).items():
            node = snapshot.nodes.get(name)
            if len(devs) < n or node is None or not node.schedulable:
                continue
            kinds = _kinds(node)
            if (model, memory) not in kinds:
                continue
            ok = devs if len(kinds) == 1 else tuple(g for g in devs if _kind(node, g) == (model, memory))
            if len(ok) < n:
                continue
            shapes.setdefault((len(ok), len(node.free) == len(node.devices)), []).append((name, ok))
        for names in shapes.values():
            names.sort()
        memo[(model, memory, n)] = shapes
    return shapes


def _span(node, gpus) -> tuple[int, int]:
    return len({node.gpu(g).nvlink_domain for g in gpus}), len({node.gpu(g).numa_node for g in gpus})


def _spread(items: list, k: int) -> list:
    if len(items) <= k:
        return items
    if k == 1:
        return [items[-1]]
    step = (len(items) - 1) / (k - 1)
    return [items[round(i * step)] for i in range(k)]
