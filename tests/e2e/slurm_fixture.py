"""A real Slurm for the tests (cli/local_slurm.py): munged, slurmctld and slurmd on this host, four GPUs as
device files, started for a module and stopped after; skipped, saying why, where Slurm is not installed."""

from __future__ import annotations

import os

import pytest

from cli.local_slurm import LocalSlurm, slurm_missing


def local_slurm(tmp_path_factory, gpus: int = 4):
    if why := slurm_missing():
        pytest.skip(f"no local Slurm: {why}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), gpus=gpus)
    before = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)  # the stack's workers inherit it
        yield cluster
    finally:
        cluster.stop()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
