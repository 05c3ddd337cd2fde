"""Topology at registration: NVLink domains from the link graph, links named as nvidia-smi names them."""

import pytest

from worker.inventory import link_name, nvlink_domains, simulated_devices


@pytest.mark.parametrize(
    "count,links,domains",
    [
        (4, {(0, 1): 4, (1, 0): 4, (2, 3): 2, (3, 2): 2}, [0, 0, 1, 1]),  # two NVLink pairs
        (3, {}, [0, 1, 2]),  # PCIe only: each GPU alone
        (4, {(0, 3): 1, (3, 1): 1}, [0, 0, 1, 0]),  # joined through another GPU
        (8, {(i, j): 12 for i in range(8) for j in range(8) if i != j}, [0] * 8),  # an NVSwitch box
    ],
)
def test_nvlink_domains(count, links, domains):
    assert nvlink_domains(count, links) == domains


def test_link_names():
    assert link_name(4, 30) == "NV4"
    assert [link_name(0, level) for level in (10, 20, 30, 40, 50)] == ["PIX", "PXB", "PHB", "NODE", "SYS"]
    assert link_name(0, None) == "unknown"


def test_simulated_inventory_has_a_topology():
    devices = simulated_devices(16, 1, per_nvlink_domain=8)
    assert devices[0].topology[7] == "NV12" and devices[0].topology[8] == "SYS"
    assert len({d.uuid for d in devices}) == 16
