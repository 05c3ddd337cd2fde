"""Samples a node's host and GPU telemetry into NodeMetrics.

GPUs come from NVML when the node has them. A node with a simulated inventory reports
simulated GPUs that carry the load of the trainer holding them (`TrainerLoad`): memory is the
trainer's resident memory, utilization its CPU activity, so a local stack looks like a cluster
at work. A small JSON file ({"0": 0.93, ...}, fractions of total) overrides a device's memory
and utilization, so tests and demos can drive the telemetry that rules act on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import psutil

from shared.contracts.messages import Device, GpuSample, NodeMetrics

log = logging.getLogger(__name__)


class NvmlGpus:
    """Every field dcgm-exporter enables by default that NVML can give, per GPU.

    A field the GPU or driver does not support stays None; an NVML failure of the whole
    device set raises, and the collector then carries on with host metrics alone.
    """

    def __init__(self) -> None:
        import pynvml  # raises NVMLError_LibraryNotFound without a driver

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        driver = _text(self._try(pynvml.nvmlSystemGetDriverVersion) or "")
        self.static = [self._identity(h) | {"driver_version": driver} for h in self.handles]
        self.last_xid: dict[int, int] = {}
        self.events = self._xid_events()

    def _try(self, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def _identity(self, h) -> dict:
        nv = self.nvml
        name = self._try(nv.nvmlDeviceGetName, h) or ""
        uuid = self._try(nv.nvmlDeviceGetUUID, h) or ""
        pci = self._try(nv.nvmlDeviceGetPciInfo, h)
        bus_id = getattr(pci, "busId", b"") if pci is not None else b""
        return {"name": _text(name), "uuid": _text(uuid), "pci_bus_id": _text(bus_id)}

    def _xid_events(self):
        """XIDs arrive as NVML events; None where the driver does not offer them."""
        nv = self.nvml
        try:
            events = nv.nvmlEventSetCreate()
            for h in self.handles:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
            return events
        except nv.NVMLError as err:
            log.info("NVML XID events unavailable (%s): DCGM_FI_DEV_XID_ERRORS stays 0", err)
            return None

    def _drain_xids(self) -> None:
        nv = self.nvml
        while self.events is not None:
            try:
                data = nv.nvmlEventSetWait_v2(self.events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending
                return
            for i in range(len(self.handles)):
                if _text(self._try(nv.nvmlDeviceGetUUID, data.device) or "") == self.static[i]["uuid"]:
                    self.last_xid[i] = int(data.eventData)

    def sample(self) -> list[GpuSample]:
        nv, t = self.nvml, self._try
        self._drain_xids()
        out = []
        for i, h in enumerate(self.handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)  # the one field every GPU has: failing here fails the set
            util = t(nv.nvmlDeviceGetUtilizationRates, h)
            enc, dec = t(nv.nvmlDeviceGetEncoderUtilization, h), t(nv.nvmlDeviceGetDecoderUtilization, h)
            power = t(nv.nvmlDeviceGetPowerUsage, h)
            ecc = lambda kind, h=h: t(nv.nvmlDeviceGetTotalEccErrors, h, kind, nv.NVML_VOLATILE_ECC)  # noqa: E731
            remap = t(nv.nvmlDeviceGetRemappedRows, h)
            fields = self._fields(h)
            out.append(
                GpuSample(
                    index=i,
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    **self.static[i],
                    util_pct=float(util.gpu) if util else 0.0,
                    mem_copy_util_pct=float(util.memory) if util else None,
                    enc_util_pct=float(enc[0]) if enc else None,
                    dec_util_pct=float(dec[0]) if dec else None,
                    sm_clock_mhz=t(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                    mem_clock_mhz=t(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                    temperature_c=t(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    memory_temperature_c=fields.get("memory_temp"),
                    power_w=power / 1000.0 if power is not None else None,
                    energy_mj=t(nv.nvmlDeviceGetTotalEnergyConsumption, h),
                    pcie_replay=t(nv.nvmlDeviceGetPcieReplayCounter, h),
                    ecc_errors=ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED) or 0,
                    ecc_corrected=ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                    remapped_rows_correctable=remap[0] if remap else None,
                    remapped_rows_uncorrectable=remap[1] if remap else None,
                    row_remap_failure=bool(remap[3]) if remap else None,
                    nvlink_bandwidth_total=fields.get("nvlink_bandwidth"),
                    nvlink_errors={
                        k: v for k, v in fields.items() if k.startswith("nvlink_") and k != "nvlink_bandwidth"
                    },
                    last_xid=self.last_xid.get(i, 0) if self.events is not None else None,
                    process_memory_bytes=self._processes(h),
                )
            )
        return out

    _FIELDS = {
        "memory_temp": "NVML_FI_DEV_MEMORY_TEMP",
        "nvlink_bandwidth": "NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL",
        "nvlink_replay": "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
        "nvlink_recovery": "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
        "nvlink_crc": "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
    }

    def _fields(self, h) -> dict[str, int]:
        """NVML field values (one call for all); a field the device lacks is left out."""
        nv = self.nvml
        wanted = {k: getattr(nv, v) for k, v in self._FIELDS.items() if hasattr(nv, v)}
        values = self._try(nv.nvmlDeviceGetFieldValues, h, list(wanted.values())) or []
        out = {}
        for key, value in zip(wanted, values):
            if getattr(value, "nvmlReturn", 1) == nv.NVML_SUCCESS:
                out[key] = int(_field_value(value))
        return out

    def _processes(self, h) -> dict[int, int]:
        procs = self._try(self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_value(field) -> float:
    """An nvmlFieldValue_t's value, by its type tag (double, uint, ulong, ulonglong, slonglong)."""
    kind = getattr(field, "valueType", 3)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal"}.get(kind, "ullVal")
    return getattr(field.value, member)


class TrainerLoad:
    """What the trainer holding a simulated device would show on it.

    The model, the same for every device a trainer holds: memory is the resident memory of the
    trainer's whole process tree (its ranks are its children) split evenly over its devices, and
    utilization is the tree's CPU use split the same way, as a share of one core per device
    (a rank's busy step loop reads 100 %). A device no trainer holds reads 0.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}  # kept, so cpu_percent measures since the last sample

    def _tree(self, pid: int) -> list[psutil.Process]:
        try:
            root = self._procs.get(pid) or psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        return [self._procs.setdefault(p.pid, p) for p in tree]

    def per_device(self, holders: dict[int, int]) -> dict[int, tuple[int, float]]:
        """device -> (memory bytes, utilization %), from {device: the pid of the trainer holding it}."""
        devices_of: dict[int, list[int]] = {}
        for device, pid in holders.items():
            devices_of.setdefault(pid, []).append(device)
        seen: set[int] = set()
        load: dict[int, tuple[int, float]] = {}
        for pid, devices in devices_of.items():
            rss, cpu = 0, 0.0
            for proc in self._tree(pid):
                seen.add(proc.pid)
                try:
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(None)
                except psutil.Error:
                    continue
            for device in devices:
                load[device] = (rss // len(devices), min(100.0, cpu / len(devices)))
        self._procs = {pid: p for pid, p in self._procs.items() if pid in seen}
        return load


class SimulatedGpus:
    def __init__(
        self, devices: list[Device], usage_file: Path | None, holders: Callable[[], dict[int, int]] = dict
    ) -> None:
        self.devices = devices
        self.usage_file = usage_file
        self.holders = holders  # device -> the pid of the trainer holding it (the worker's heartbeat)
        self.load = TrainerLoad()

    def _usage(self) -> dict[int, float]:
        if not (self.usage_file and self.usage_file.exists()):
            return {}
        try:
            return {int(k): float(v) for k, v in json.loads(self.usage_file.read_text()).items()}
        except (ValueError, OSError) as err:
            log.warning("simulated usage file unreadable: %s", err)
            return {}

    def sample(self) -> list[GpuSample]:
        usage = self._usage()
        load = self.load.per_device(self.holders())
        out = []
        for d in self.devices:
            if d.index in usage:
                used, util = int(d.memory_total_bytes * usage[d.index]), 100.0 * usage[d.index]
            else:
                used, util = load.get(d.index, (0, 0.0))
            out.append(
                GpuSample(
                    index=d.index,
                    memory_total_bytes=d.memory_total_bytes,
                    simulated=True,
                    memory_used_bytes=min(used, d.memory_total_bytes),
                    util_pct=util,
                    uuid=d.uuid,
                    name=d.name,
                    pci_bus_id=d.pci_bus_id,
                )
            )
        return out


class HostSampler:
    """CPU, memory, swap, and disk/network rates since the previous sample."""

    def __init__(self) -> None:
        psutil.cpu_percent(None)
        self._last = self._counters()

    @staticmethod
    def _counters() -> tuple[float, float, float, float, float]:
        import time

        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        return (
            time.monotonic(),
            disk.read_bytes if disk else 0,
            disk.write_bytes if disk else 0,
            net.bytes_recv,
            net.bytes_sent,
        )

    def sample(self, node: str, ts: float) -> NodeMetrics:
        now = self._counters()
        dt = max(now[0] - self._last[0], 1e-6)
        rates = [(now[i] - self._last[i]) / dt for i in range(1, 5)]
        self._last = now
        mem = psutil.virtual_memory()
        return NodeMetrics(
            node=node,
            ts=ts,
            cpu_pct=psutil.cpu_percent(None),
            mem_used_bytes=mem.total - mem.available,
            mem_total_bytes=mem.total,
            swap_used_bytes=psutil.swap_memory().used,
            disk_read_bps=rates[0],
            disk_write_bps=rates[1],
            net_rx_bps=rates[2],
            net_tx_bps=rates[3],
        )
