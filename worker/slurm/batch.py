"""The batch job ADC submits: run by slurmd on the compute node, as root like the built-in worker.

It carries out the launch the worker planned (worker/trainer_process.py wrote `slurm-launch.json` in the
attempt folder: the sandboxed argv, the built environment, the memory cap), so a trainer under Slurm runs
in the same sandbox as one the worker starts itself: bwrap, its own network namespace, the trainer's uid,
its log and events on descriptors opened here with O_NOFOLLOW in the worker's folder. And it turns
Slurm's signals into the trainer's contract:

- SIGUSR1 (`scancel --signal=USR1 --batch`, or `--signal=B:USR1@grace` before the time limit): the stop
  request, so the trainer checkpoints at its next step boundary and exits 75;
- SIGTERM (scancel, a preemption by Slurm itself): passed on to the trainer's process group.

It writes how the trainer ended to `exit.json` (a root file in a root folder: no trainer can forge it)
and exits with the trainer's code. Run again by Slurm (a requeue), it resumes from the job's newest
complete checkpoint.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from worker import job_files
from worker.trainer.checkpoints import checkpoint_step, latest_complete_checkpoint

LAUNCH_FILE = "slurm-launch.json"
EXIT_FILE = "exit.json"
_PR_SET_PDEATHSIG = 1


def resume_newest(attempt_fd: int, output_dir: Path) -> None:
    """A requeued run goes on from the newest complete checkpoint, not from where the first run began."""
    newest = latest_complete_checkpoint(output_dir)
    if newest is None:
        return
    train = yaml.safe_load(job_files.read_file(attempt_fd, "train.yaml", 1 << 20)) or {}
    asked = train.get("resume_from_checkpoint")
    if asked is None or checkpoint_step(newest) > (checkpoint_step(asked) or 0):
        train["resume_from_checkpoint"] = str(newest)
        job_files.write_file(attempt_fd, "train.yaml", yaml.safe_dump(train, sort_keys=False).encode())


def main(attempt_dir: str) -> int:
    attempt_fd = os.open(attempt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    spec = json.loads(job_files.read_file(attempt_fd, LAUNCH_FILE, 1 << 20))
    if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
        resume_newest(attempt_fd, Path(spec["output_dir"]))
        job_files.remove(attempt_fd, spec["stop_file"])
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    logfile = job_files.open_file(attempt_fd, spec["log"], flags)
    events = job_files.open_file(attempt_fd, spec["events"], flags)
    env = dict(spec["env"], ADC_EVENTS_FD=str(events))
    if env.get("CUDA_VISIBLE_DEVICES") and os.environ.get("CUDA_VISIBLE_DEVICES"):
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]  # Slurm's numbering (cgroup-constrained)
    limit = spec.get("memory_limit_bytes")

    def in_child() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    switch = spec.get("switch") or {}
    child = subprocess.Popen(
        spec["argv"],
        cwd=attempt_dir,
        env=env,
        stdout=logfile,
        stderr=logfile,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=(events,),
        preexec_fn=in_child,
        **({"user": switch["user"], "group": switch["group"], "extra_groups": []} if switch else {}),
    )
    os.close(logfile)
    os.close(events)

    def stop_request(*_) -> None:
        job_files.touch(attempt_fd, spec["stop_file"])

    def pass_on(signum, _frame) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGUSR1, stop_request)
    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    code = child.wait()
    record = {"code": code, "signal": None} if code >= 0 else {"code": None, "signal": -code}
    record["slurm_job_gpus"] = os.environ.get("SLURM_JOB_GPUS")  # what Slurm allocated, for people and tests
    job_files.write_file(attempt_fd, EXIT_FILE, json.dumps(record).encode())
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
