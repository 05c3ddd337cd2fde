"""The batch job ADC submits: run by slurmd on the compute node as the team's uid (`sbatch --uid`), so
Slurm's accounting shows whose job it is.

It carries out the launch the worker planned (worker/slurm/trainer.py wrote `slurm-launch.json` in the
attempt folder: the trainer's argv, the built environment, the memory cap, the sandbox's folders), so a
trainer under Slurm runs in the same sandbox as one the worker starts itself, built here without root:
bubblewrap in a user namespace of its own that maps the uid to itself (no capability, no further user
namespace, no_new_privs), its own pid and network namespaces (loopback only), `--die-with-parent`, the
read-only root with the storage root, every team's folders and the hidden paths masked, only the job
folder writable, and the job's readable folders put back. A readable folder the uid cannot read cannot be
bound: the launch is refused, saying which (exit 2, a config error), before anything of the trainer runs.

The launcher is the trainer's uid, so nothing it writes is trusted afterwards: the worker takes how the
attempt ended from Slurm (the job's state and the batch script's exit code, squeue), and what the launcher
reads it reads once, before the trainer starts, from the worker's attempt folder, where the uid can
create, rename or change nothing. It writes only in the attempt's `run/` folder, the uid's: the stop file,
and on a requeue the config that resumes from the newest checkpoint. Slurm's signals become the trainer's
contract:

- SIGUSR1 (`scancel --signal=USR1 --batch`, or `--signal=B:USR1@grace` before the time limit): the stop
  request, so the trainer checkpoints at its next step boundary and exits 75;
- SIGTERM (scancel, a preemption by Slurm itself): passed on to the trainer's process group.
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
from worker.sandbox import Identity, bwrap_argv
from worker.trainer.checkpoints import checkpoint_step, latest_complete_checkpoint

LAUNCH_FILE = "slurm-launch.json"
RUN_DIR = "run"  # the launcher's folder in the attempt folder, owned by the trainer's uid
CONFIG_ERROR = 2  # the trainer's contract: a config error (shared/contracts/outcomes.py)
_PR_SET_PDEATHSIG = 1


class Refused(RuntimeError):
    """The sandbox cannot be built as this uid (a folder it cannot read): the trainer does not start."""


def resume_newest(attempt_fd: int, run_fd: int, config: str, output_dir: Path) -> str | None:
    """A requeued run goes on from the newest complete checkpoint, not from where the first run began: the
    worker's train.yaml with that checkpoint, written to `run/` (the name of the config to use), or None."""
    newest = latest_complete_checkpoint(output_dir)
    if newest is None:
        return None
    train = yaml.safe_load(job_files.read_file(attempt_fd, config, 1 << 20)) or {}
    asked = train.get("resume_from_checkpoint")
    if asked is not None and checkpoint_step(newest) <= (checkpoint_step(asked) or 0):
        return None
    train["resume_from_checkpoint"] = str(newest)
    job_files.write_file(run_fd, config, yaml.safe_dump(train, sort_keys=False).encode())
    return config


def unreadable(sandbox: dict) -> list[str]:
    """The folders the sandbox needs that this uid cannot use: a readable one it cannot list and pass
    through, or the job's own output folders it cannot write."""
    problems = []
    for folder in sandbox["readable"]:
        try:
            os.stat(folder)
        except FileNotFoundError:
            continue  # nothing to bind (bwrap_argv leaves it out)
        except OSError as err:
            problems.append(f"{folder} cannot be reached by uid {os.geteuid()} ({err.strerror})")
            continue
        if not os.access(folder, os.R_OK | os.X_OK):
            problems.append(f"{folder} is not readable by uid {os.geteuid()}")
    for folder in sandbox["writable"]:
        if not os.access(folder, os.W_OK | os.X_OK):
            problems.append(f"{folder} is not writable by uid {os.geteuid()}")
    return problems


def sandboxed(spec: dict, argv: list[str]) -> list[str]:
    """The trainer's argv inside bubblewrap, built as this uid (a user namespace mapping it to itself)."""
    sandbox = spec.get("sandbox")
    if not sandbox:
        return argv
    if problems := unreadable(sandbox):
        raise Refused(
            "the trainer's sandbox is built as its uid under Slurm, which cannot use every folder it needs: "
            + "; ".join(problems)
            + " (deploy/slurm/README.md: what a compute node must let the team uids read)"
        )
    me = Identity(os.geteuid(), os.getegid())
    wrapped = bwrap_argv(
        sandbox["bwrap"],
        me,
        argv,
        writable=Path(sandbox["job_dir"]),
        readable=[Path(p) for p in sandbox["readable"]],
        hidden=[Path(p) for p in sandbox["hidden"]],
        own_network=True,
    )
    # bwrap_argv drops to another uid only for a root caller; here the caller is the uid: a user namespace.
    userns = ["--unshare-user", "--disable-userns", "--uid", str(me.uid), "--gid", str(me.gid)]
    return [wrapped[0], *userns, *wrapped[1:]]


def main(attempt_dir: str) -> int:
    attempt_fd = os.open(attempt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    spec = json.loads(job_files.read_file(attempt_fd, LAUNCH_FILE, 1 << 20))
    run_fd = os.open(RUN_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=attempt_fd)
    flags = os.O_WRONLY | os.O_APPEND
    logfile = job_files.open_file(attempt_fd, spec["log"], flags)  # made by the worker, given to the uid
    events = job_files.open_file(attempt_fd, spec["events"], flags)
    argv = list(spec["argv"])
    if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
        job_files.remove(run_fd, spec["stop_file"])
        config = spec["config"]
        if resume_newest(attempt_fd, run_fd, config, Path(spec["output_dir"])):
            argv = [
                str(Path(attempt_dir) / RUN_DIR / config) if a == str(Path(attempt_dir) / config) else a for a in argv
            ]
    try:
        if spec.get("uid") is not None and spec["uid"] != os.geteuid():
            raise Refused(f"the launch was planned for uid {spec['uid']}, the batch job runs as uid {os.geteuid()}")
        argv = sandboxed(spec, argv)
    except Refused as err:
        os.write(logfile, f"slurm launcher: {err}\n".encode())
        return CONFIG_ERROR
    env = dict(spec["env"], ADC_EVENTS_FD=str(events))
    if env.get("CUDA_VISIBLE_DEVICES") and os.environ.get("CUDA_VISIBLE_DEVICES"):
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]  # Slurm's numbering (cgroup-constrained)
    limit = spec.get("memory_limit_bytes")

    def in_child() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    started: list[subprocess.Popen] = []

    def stop_request(*_) -> None:
        try:
            job_files.touch(run_fd, spec["stop_file"])
        except OSError as err:  # `run/` is the uid's: a trainer that put something there breaks only its own stop
            print(f"slurm launcher: the stop file could not be made ({err})", flush=True)

    def pass_on(signum, _frame) -> None:
        if not started:  # before the trainer: the launcher itself ends, as Slurm asked
            os._exit(128 + signum)
        try:
            os.killpg(started[0].pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGUSR1, stop_request)
    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    child = subprocess.Popen(
        argv,
        cwd=attempt_dir,
        env=env,
        stdout=logfile,
        stderr=logfile,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=(events,),
        preexec_fn=in_child,
    )
    started.append(child)
    os.close(logfile)
    os.close(events)
    code = child.wait()
    print(f"slurm launcher: the trainer ended ({code}); SLURM_JOB_GPUS={os.environ.get('SLURM_JOB_GPUS')}", flush=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
