"""Samples a node's host and GPU telemetry into NodeMetrics.

GPUs come from NVML when the node has them. A node with a simulated inventory reports
simulated GPUs whose memory use is read from a small JSON file ({"0": 0.93, ...}, fractions
of total), so tests and demos can drive the telemetry that rules act on.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import psutil

from shared.messages import Device, GpuSample, NodeMetrics

log = logging.getLogger(__name__)


class NvmlGpus:
    def __init__(self) -> None:
        import pynvml  # raises NVMLError_LibraryNotFound without a driver
        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def sample(self) -> list[GpuSample]:
        nv = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            util = nv.nvmlDeviceGetUtilizationRates(h)
            sample = GpuSample(index=i, memory_used_bytes=int(mem.used), memory_total_bytes=int(mem.total),
                               util_pct=float(util.gpu))
            try:
                sample.temperature_c = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                sample.power_w = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            except nv.NVMLError:
                pass
            try:
                sample.ecc_errors = int(nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
            except nv.NVMLError:
                pass
            out.append(sample)
        return out


class SimulatedGpus:
    def __init__(self, devices: list[Device], usage_file: Path | None) -> None:
        self.devices = devices
        self.usage_file = usage_file

    def sample(self) -> list[GpuSample]:
        usage: dict[str, float] = {}
        if self.usage_file and self.usage_file.exists():
            try:
                usage = {str(k): float(v) for k, v in json.loads(self.usage_file.read_text()).items()}
            except (ValueError, OSError) as err:
                log.warning("simulated usage file unreadable: %s", err)
        return [GpuSample(index=d.index, memory_total_bytes=d.memory_total_bytes, simulated=True,
                          memory_used_bytes=int(d.memory_total_bytes * usage.get(str(d.index), 0.0)),
                          util_pct=100.0 * usage.get(str(d.index), 0.0))
                for d in self.devices]


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
        return (time.monotonic(), disk.read_bytes if disk else 0, disk.write_bytes if disk else 0,
                net.bytes_recv, net.bytes_sent)

    def sample(self, node: str, ts: float) -> NodeMetrics:
        now = self._counters()
        dt = max(now[0] - self._last[0], 1e-6)
        rates = [(now[i] - self._last[i]) / dt for i in range(1, 5)]
        self._last = now
        mem = psutil.virtual_memory()
        return NodeMetrics(node=node, ts=ts, cpu_pct=psutil.cpu_percent(None), mem_used_bytes=mem.total - mem.available,
                           mem_total_bytes=mem.total, swap_used_bytes=psutil.swap_memory().used,
                           disk_read_bps=rates[0], disk_write_bps=rates[1], net_rx_bps=rates[2], net_tx_bps=rates[3])
