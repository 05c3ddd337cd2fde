"""GPU telemetry as Prometheus series named as dcgm-exporter names them.

Dashboards and alerts built on dcgm-exporter (`DCGM_FI_DEV_FB_USED{gpu, UUID, modelName,
Hostname}`, ...) work unchanged on ADC: every field of dcgm-exporter's default counter set that
NVML can give, with its units (framebuffer in MiB, power in W, energy in mJ), its metric type
(counter or gauge, as dcgm-exporter's counters file types it) and its labels, including
`DCGM_FI_DRIVER_VERSION` and `hpc_job`, the label dcgm-exporter gives the job holding a GPU (the
ADC job id here; `job` is Prometheus's own target label). A field a GPU does not report is left
out rather than shown as 0. The DCGM_FI_PROF_* fields need DCGM's profiling module, which NVML
does not offer, so they are absent.

Each node's collector serves its own GPUs on `/metrics` (`hpc_job` from its worker's heartbeat).
The api serves no GPU series, so scraping the collectors and the api never counts one twice; a
job's team joins in from the api's `adc_job_info{hpc_job, team}`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from shared.contracts.messages import GpuSample, NodeMetrics

MIB = 2**20
JOB_LABEL = "hpc_job"
LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", JOB_LABEL]

# (name, help, value of a sample or None when the GPU does not report it)
FIELDS: list[tuple[str, str, Callable[[GpuSample], float | None]]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.mem_clock_mhz),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", lambda g: g.memory_temperature_c),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ); a counter.",
        lambda g: g.energy_mj,
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries; a counter.", lambda g: g.pcie_replay),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.util_pct),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.mem_copy_util_pct),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", lambda g: g.enc_util_pct),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", lambda g: g.dec_util_pct),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", lambda g: g.last_xid),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda g: (g.memory_total_bytes - g.memory_used_bytes) / MIB,
    ),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.memory_used_bytes / MIB),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "Total number of NVLink bandwidth counters for all lanes; a counter.",
        lambda g: g.nvlink_bandwidth_total,
    ),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "NVLink replay errors; a counter.",
        lambda g: g.nvlink_errors.get("nvlink_replay"),
    ),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "NVLink recovery errors; a counter.",
        lambda g: g.nvlink_errors.get("nvlink_recovery"),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "NVLink flow-control CRC errors; a counter.",
        lambda g: g.nvlink_errors.get("nvlink_crc"),
    ),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Single-bit volatile ECC errors; a counter.", lambda g: g.ecc_corrected),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Double-bit volatile ECC errors; a counter.",
        lambda g: g.ecc_errors if not g.simulated else None,
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors; a counter.",
        lambda g: g.remapped_rows_uncorrectable,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors; a counter.",
        lambda g: g.remapped_rows_correctable,
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed.",
        lambda g: None if g.row_remap_failure is None else float(g.row_remap_failure),
    ),
]
NAMES = [name for name, _, _ in FIELDS]
JOB_MEMORY = "adc_gpu_job_memory_bytes"
HOST = [
    ("adc_node_cpu_percent", "Host CPU use (in %).", lambda m: m.cpu_pct),
    ("adc_node_memory_used_bytes", "Host memory in use.", lambda m: m.mem_used_bytes),
    ("adc_node_memory_total_bytes", "Host memory.", lambda m: m.mem_total_bytes),
    ("adc_node_swap_used_bytes", "Swap in use.", lambda m: m.swap_used_bytes),
]

# (node, gpu index) -> the job id holding it, "" where unknown or idle
Holder = Callable[[str, int], str]
# (node, pid) -> the ADC job that process belongs to, or None
ProcessOwner = Callable[[str, int], str | None]


def metric_type(doc: str) -> str:
    """dcgm-exporter's type of a field: its help text says when it is a counter."""
    return "counter" if doc.endswith("a counter.") else "gauge"


def families(nodes: Iterable[NodeMetrics], holder: Holder, owner: ProcessOwner | None = None) -> list[Metric]:
    """The DCGM-named families for these nodes' latest samples."""
    # Plain Metric families: the client's counter family would rename a counter to `<name>_total`.
    fields = {name: Metric(name, doc, metric_type(doc)) for name, doc, _ in FIELDS}
    per_job = GaugeMetricFamily(
        JOB_MEMORY,
        "GPU memory held by an ADC job's processes (NVML per-process).",
        labels=["gpu", "UUID", "Hostname", JOB_LABEL],
    )
    host = {name: GaugeMetricFamily(name, doc, labels=["Hostname"]) for name, doc, _ in HOST}
    for node in nodes:
        for name, _, value in HOST:
            host[name].add_metric([node.node], float(value(node)))
        for g in node.gpus:
            labels = dict(
                zip(
                    LABELS,
                    [
                        str(g.index),
                        g.uuid,
                        g.pci_bus_id,
                        f"nvidia{g.index}",
                        g.name,
                        node.node,
                        g.driver_version,
                        holder(node.node, g.index),
                    ],
                )
            )
            for name, _, value in FIELDS:
                v = value(g)
                if v is not None:
                    fields[name].add_sample(name, labels, float(v))
            if owner is not None:
                held: dict[str, int] = {}
                for pid, used in g.process_memory_bytes.items():
                    key = owner(node.node, pid) or "(not ADC)"
                    held[key] = held.get(key, 0) + used
                for key, used in sorted(held.items()):
                    per_job.add_metric([str(g.index), g.uuid, node.node, key], float(used))
    return [*fields.values(), per_job, *host.values()]


class _Fixed:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


COUNTERS = frozenset(name for name, doc, _ in FIELDS if metric_type(doc) == "counter")


def exposition(metrics: list[Metric]) -> bytes:
    """Prometheus text format for ready-made families.

    The client library heads a counter family `<name>_total`; dcgm-exporter heads its counters
    with their own names (`# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter`), which is what its
    dashboards and recording rules expect, so those headers are put back."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    text = generate_latest(registry)
    for name in COUNTERS:
        text = text.replace(f"# HELP {name}_total ".encode(), f"# HELP {name} ".encode(), 1)
        text = text.replace(f"# TYPE {name}_total counter".encode(), f"# TYPE {name} counter".encode(), 1)
    return text
