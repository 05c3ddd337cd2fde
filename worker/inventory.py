"""What devices a node offers: real GPUs through NVML, a simulated inventory, or CPU slots."""

from __future__ import annotations

import logging
import os

from shared.contracts.messages import Device
from shared.contracts.node_devices import parse_size as parse_size
from shared.contracts.node_devices import simulated_devices as simulated_devices

log = logging.getLogger(__name__)


def nvml_devices() -> list[Device]:
    """The node's GPUs with their topology, or [] when there is no NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as err:  # NVMLError_LibraryNotFound and friends: no GPUs here
        log.info("no NVIDIA GPUs through NVML (%s)", type(err).__name__)
        return []
    nv = pynvml

    def attempt(fn, *args, default=None):
        try:
            return fn(*args)
        except nv.NVMLError:
            return default

    bus_ids = [_text(getattr(attempt(nv.nvmlDeviceGetPciInfo, h), "busId", b"")) for h in handles]
    links = nvlink_peers(handles, bus_ids, nv)
    levels = {
        (i, j): attempt(nv.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
        for i in range(len(handles))
        for j in range(len(handles))
        if i != j
    }
    domains = nvlink_domains(len(handles), links)
    devices = []
    for i, handle in enumerate(handles):
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        numa = attempt(nv.nvmlDeviceGetNumaNodeId, handle, default=0)
        devices.append(
            Device(
                index=i,
                kind="gpu",
                name=_text(attempt(nv.nvmlDeviceGetName, handle, default="")),
                memory_total_bytes=int(mem.total),
                numa_node=max(numa, 0),
                uuid=_text(attempt(nv.nvmlDeviceGetUUID, handle, default="")),
                pci_bus_id=bus_ids[i],
                nvlink_domain=domains[i],
                topology={
                    j: link_name(links.get((i, j), 0), levels.get((i, j))) for j in range(len(handles)) if j != i
                },
            )
        )
    return devices


def nvlink_peers(handles: list, bus_ids: list[str], nv) -> dict[tuple[int, int], int]:
    """(i, j) -> the number of active NVLinks from GPU i to GPU j."""
    by_bus = {b.lower(): j for j, b in enumerate(bus_ids) if b}
    links: dict[tuple[int, int], int] = {}
    for i, h in enumerate(handles):
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()
            except nv.NVMLError:  # no such link, or NVLink not supported at all
                break
            if (j := by_bus.get(remote)) is not None and j != i:  # an NVSwitch is not a GPU
                links[(i, j)] = links.get((i, j), 0) + 1
    return links


def nvlink_domains(count: int, links: dict[tuple[int, int], int]) -> list[int]:
    """GPUs joined by NVLink (directly or through others) share a domain; numbered from 0 in index order."""
    domain = list(range(count))

    def root(i: int) -> int:
        while domain[i] != i:
            domain[i] = domain[domain[i]]
            i = domain[i]
        return i

    for i, j in links:
        a, b = root(i), root(j)
        if a != b:
            domain[max(a, b)] = min(a, b)
    numbering: dict[int, int] = {}
    return [numbering.setdefault(root(i), len(numbering)) for i in range(count)]


# nvmlGpuTopologyLevel_t -> the names `nvidia-smi topo -m` prints.
_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def link_name(nvlinks: int, level: int | None) -> str:
    if nvlinks:
        return f"NV{nvlinks}"
    return _LEVELS.get(level, "SYS") if level is not None else "unknown"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cpu_slots(count: int) -> list[Device]:
    return [Device(index=i, kind="cpu", name="cpu-slot") for i in range(count)]


def node_cores() -> int:
    """The cores this process may run on (its affinity), which its trainers share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(cores: int, devices: int) -> int:
    """Each device's rank gets an equal share of the node's cores as its CPU threads. A trainer
    left to torch's default takes every core; two of them side by side on the same cores spin in
    OpenMP's barriers and ran 35x slower per step here (2 ranks on 2 cores with 2 threads each)."""
    return max(1, cores // max(1, devices))


def discover(simulate_gpus: int = 0, gpu_memory: str = "80GiB", cpu_slot_count: int = 1) -> list[Device]:
    if simulate_gpus > 0:
        return simulated_devices(simulate_gpus, parse_size(gpu_memory))
    return nvml_devices() or cpu_slots(cpu_slot_count)
