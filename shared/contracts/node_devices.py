"""What a node is called and what devices it says it has, as the worker and the collector both read
them: a node name, a size such as 80GiB, and a simulated GPU inventory."""

from __future__ import annotations

import re

from shared.contracts.messages import Device

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "kib": 2**10,
    "m": 1e6,
    "mb": 1e6,
    "mib": 2**20,
    "g": 1e9,
    "gb": 1e9,
    "gib": 2**30,
    "t": 1e12,
    "tb": 1e12,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """'80GiB' -> bytes. Refuses anything it does not understand."""
    m = _SIZE.match(text)
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 80GiB, 24GB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def node_name(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", text):
        raise ValueError("a node name is lowercase letters, digits, '-' and '_' (at most 63)")
    return text


def simulated_devices(
    count: int, memory_bytes: int, name: str = "Simulated-GPU", per_nvlink_domain: int = 8
) -> list[Device]:
    return [
        Device(
            index=i,
            kind="gpu",
            name=name,
            memory_total_bytes=memory_bytes,
            simulated=True,
            nvlink_domain=i // per_nvlink_domain,
            uuid=f"GPU-simulated-{i:04d}",
            pci_bus_id=f"00000000:{i + 1:02X}:00.0",
            topology={
                j: "NV12" if j // per_nvlink_domain == i // per_nvlink_domain else "SYS" for j in range(count) if j != i
            },
        )
        for i in range(count)
    ]
