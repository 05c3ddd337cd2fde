"""Free devices per schedulable node during one pass, and the summaries that let placement answer
"does not fit" without a scan."""

from __future__ import annotations

from collections.abc import Iterable

from services.decider.snapshot import NodeView, Snapshot
from shared.contracts.actions import NodeGpus


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
    def of(cls, snapshot: Snapshot) -> FreeDevices:
        base = snapshot._memo.get("free")
        if base is None:  # once per snapshot; every caller books into its own copy
            base = snapshot._memo["free"] = cls.from_sorted(
                {n.id: n.free_sorted for n in snapshot.nodes.values() if n.schedulable}
            )  # sorted once per node view
        return base.copy()

    @classmethod
    def from_sorted(cls, free: dict[str, tuple[int, ...]]) -> FreeDevices:
        """From devices already in sorted tuples (the constructor sorts them); `free` is copied."""
        made = cls.__new__(cls)
        made._free = dict(free)
        made._forget()
        return made

    def copy(self) -> FreeDevices:
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

    def counts_with_each(
        self, nodes: dict[str, NodeView], released: Iterable[Iterable[NodeGpus]]
    ) -> list[tuple[int, int]]:
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
