"""What devices a node offers: real GPUs through NVML, a simulated inventory, or CPU slots."""
from __future__ import annotations

import re

from shared.messages import Device

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
          "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def parse_size(text: str) -> int:
    """'80GiB' -> bytes. Refuses anything it does not understand."""
    m = _SIZE.match(text)
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 80GiB, 24GB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def nvml_devices() -> list[Device]:
    """The node's GPUs, or [] when there is no NVIDIA driver."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound and friends: no GPUs here
        return []
    devices = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        name = pynvml.nvmlDeviceGetName(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            numa = pynvml.nvmlDeviceGetNumaNodeId(handle)
        except Exception:
            numa = 0
        devices.append(Device(index=i, kind="gpu", name=name if isinstance(name, str) else name.decode(),
                              memory_total_bytes=int(mem.total), numa_node=max(numa, 0)))
    return devices


def simulated_devices(count: int, memory_bytes: int, name: str = "Simulated-GPU", per_nvlink_domain: int = 8) -> list[Device]:
    return [Device(index=i, kind="gpu", name=name, memory_total_bytes=memory_bytes, simulated=True,
                   nvlink_domain=i // per_nvlink_domain) for i in range(count)]


def cpu_slots(count: int) -> list[Device]:
    return [Device(index=i, kind="cpu", name="cpu-slot") for i in range(count)]


def discover(simulate_gpus: int = 0, gpu_memory: str = "80GiB", cpu_slot_count: int = 1) -> list[Device]:
    if simulate_gpus > 0:
        return simulated_devices(simulate_gpus, parse_size(gpu_memory))
    return nvml_devices() or cpu_slots(cpu_slot_count)
