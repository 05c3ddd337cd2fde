"""What the Slurm backend refuses before anything reaches Slurm."""

from __future__ import annotations

from shared.contracts.actions import NodeGpus
from shared.contracts.messages import Command
from worker.slurm.backend import SlurmBackend
from worker.slurm.inventory import SlurmInventory


def start(*placement: NodeGpus) -> Command:
    return Command(kind="start", job_id="j1", attempt=1, train={}, placement=list(placement), team="default")


def test_a_multi_node_start_is_refused_naming_its_nodes_and_a_single_node_one_is_not():
    backend = SlurmBackend("node-1", SlurmInventory("node-1", 80 << 30))
    why = backend.refusal(start(NodeGpus(node="node-1", gpus=(0,)), NodeGpus(node="node-2", gpus=(0,))))
    assert why is not None and "single-node" in why and "node-1, node-2" in why
    assert backend.refusal(start(NodeGpus(node="node-1", gpus=(0, 1)))) is None
