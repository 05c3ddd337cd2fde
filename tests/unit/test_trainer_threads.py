"""Each rank's CPU threads: its device's share of the node's cores, never more than the node has."""

import pytest

from worker.inventory import threads_per_rank


@pytest.mark.parametrize(
    "cores,devices,threads",
    [
        (2, 1, 2),  # one slot: the whole node
        (2, 2, 1),  # two slots side by side: a core each
        (1, 2, 1),  # more slots than cores: still one thread, never none
        (64, 8, 8),  # an 8-GPU node: 8 cores per GPU's rank
        (96, 8, 12),
    ],
)
def test_a_rank_gets_its_devices_share_of_the_cores(cores, devices, threads):
    assert threads_per_rank(cores, devices) == threads
    assert threads_per_rank(cores, devices) * devices <= max(cores, devices)
