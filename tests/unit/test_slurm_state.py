"""Reading Slurm 22.05's `squeue --json` and `sinfo --json` (the documents below are its output on this
project's one-host cluster, trimmed to the fields ADC reads)."""

from __future__ import annotations

from worker.slurm.state import SlurmJob, SlurmNode, gpu_indices, gres_indices, indices


def test_index_lists_and_ranges():
    assert indices("0-2,5") == [0, 1, 2, 5]
    assert gres_indices(["gpu:i1:1(IDX:1),gpu:i3:1(IDX:3)"]) == [1, 3]
    assert gres_indices("gpu:i0:0(IDX:N/A),gpu:i1:2(IDX:1-2)") == [1, 2]
    assert gpu_indices("gpu:i0:1,gpu:i1:1,gpu:a100:1") == [0, 1]  # only ADC's per-GPU types name an index


def test_a_job_that_exited_75_reads_as_code_75_and_one_killed_by_a_signal_as_none():
    doc = {
        "job_id": 1,
        "name": "adc-j1-1",
        "job_state": "FAILED",
        "exit_code": 75 << 8,
        "gres_detail": ["gpu:i1:1(IDX:1)"],
        "nodes": "node-1",
        "state_reason": "NonZeroExitCode",
        "restart_cnt": 0,
    }
    job = SlurmJob.of(doc)
    assert (job.exit_code, job.gpus, job.final) == (75, (1,), True)
    assert SlurmJob.of(doc | {"exit_code": 15, "job_state": "CANCELLED"}).exit_code is None
    assert not SlurmJob.of(doc | {"job_state": "RUNNING"}).final


def test_a_drained_or_down_node_is_closed_and_an_idle_one_is_not():
    doc = {"name": "node-1", "state": "idle", "state_flags": [], "gres": "gpu:i0:1,gpu:i1:1", "gres_used": ""}
    assert SlurmNode.of(doc).gpus == (0, 1) and not SlurmNode.of(doc).closed
    assert SlurmNode.of(doc | {"state_flags": ["DRAIN"]}).closed
    assert SlurmNode.of(doc | {"state": "down"}).closed
    used = SlurmNode.of(doc | {"state": "mixed", "gres_used": "gpu:i0:1(IDX:0),gpu:i1:0(IDX:N/A)"})
    assert used.gpus_used == (0,) and not used.closed
