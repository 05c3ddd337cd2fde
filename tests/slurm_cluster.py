"""A real Slurm for the tests (cli/local_slurm.py): munged, slurmctld and slurmd on this host, GPUs as
device files, started for a module and stopped after; skipped, saying why, where Slurm is not installed.

Slurm runs each trainer as its team's uid, which must reach the storage root and the models like on a real
compute node: the node's view (cli/local_slurm.py) has this run's pytest folder, and `open_to_trainers`
lets the uid pass through the folders pytest made for the owner only (mode 0700) down to a stack's storage."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from cli.local_slurm import LocalSlurm, slurm_missing


@contextlib.contextmanager
def local_slurm(tmp_path_factory, gpus: int):
    if why := slurm_missing():
        pytest.skip(f"no local Slurm: {why}")
    base = tmp_path_factory.getbasetemp()
    base.chmod(0o711)  # passable, not listable
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), gpus=gpus, reachable=[base])
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


def slurm_job_of(job: dict, attempt: int | None = None) -> int:
    """The Slurm job id an attempt of an ADC job ran as (the worker's record in the attempt folder)."""
    folder = Path(job["output_dir"]).parent / f"attempt-{attempt or job['attempt']}"
    return int(json.loads((folder / "slurm.json").read_text())["slurm_job_id"])


def squeue(cluster: LocalSlurm) -> dict[int, dict]:
    """Every job Slurm still lists (running or recently ended), by id."""
    return {int(d["job_id"]): d for d in json.loads(cluster.run("squeue", "--json", "--states=all"))["jobs"]}


def open_to_trainers(live) -> Path:
    """The stack's storage root, every folder from pytest's down to it passable by the trainers' uid (what a
    compute node's shared storage is: deploy/slurm/README.md)."""
    storage = live.stack.home / "data"
    storage.mkdir(mode=0o755, exist_ok=True)
    for folder in [live.stack.home, storage]:
        folder.chmod(folder.stat().st_mode | 0o011)
    return storage
