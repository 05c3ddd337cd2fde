"""Slurm's own command-line tools, run with argument lists (never a shell): sbatch, scancel, squeue, sinfo,
scontrol. They find the cluster as they always do (SLURM_CONF, else /etc/slurm/slurm.conf) and
authenticate through munge; the worker adds nothing of its own to their environment."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess

from worker.slurm.state import SlurmJob, SlurmNode

log = logging.getLogger(__name__)
COMMAND_TIMEOUT_S = 30.0
# What Slurm's tools take from the worker's environment: where the cluster is, locale, nothing else.
_PASSED = ("SLURM_CONF", "PATH", "LANG", "LC_ALL", "TZ", "HOME")


class SlurmError(RuntimeError):
    """A Slurm tool failed (slurmctld unreachable, a refused submission): its own words, bounded."""


def _env() -> dict[str, str]:
    return {k: os.environ[k] for k in _PASSED if k in os.environ}


async def run(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """The tool's stdout; SlurmError with its stderr if it fails or does not answer in time."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SlurmError(f"{argv[0]} did not answer within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise SlurmError(f"{' '.join(argv[:2])} failed ({proc.returncode}): {err.decode(errors='replace')[:500]}")
    return out.decode(errors="replace")


def run_sync(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """`run` for a caller that is not a coroutine (a leftover's liveness check)."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, env=_env(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise SlurmError(f"{argv[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')[:500]}")
    return done.stdout.decode(errors="replace")


def _jobs(text: str) -> list[SlurmJob]:
    return [SlurmJob.of(doc) for doc in json.loads(text).get("jobs") or []]


def job_argv(job_id: int) -> list[str]:
    # --states=all: a job that ended is still listed (for slurm.conf's MinJobAge), with its exit code.
    return ["squeue", "--json", "--states=all", f"--jobs={job_id}"]


async def job(job_id: int) -> SlurmJob | None:
    """Slurm's view of one job; None once Slurm has forgotten it (MinJobAge after it ended)."""
    try:
        found = _jobs(await run(job_argv(job_id)))
    except SlurmError as err:
        if "Invalid job id" in str(err):
            return None
        raise
    return next((j for j in found if j.job_id == job_id), None)


def job_sync(job_id: int) -> SlurmJob | None:
    try:
        found = _jobs(run_sync(job_argv(job_id)))
    except SlurmError as err:
        if "Invalid job id" in str(err):
            return None
        raise
    return next((j for j in found if j.job_id == job_id), None)


async def jobs_on(node: str) -> list[SlurmJob]:
    """Every job Slurm runs (or is starting) on `node`, whoever submitted it."""
    return [j for j in _jobs(await run(["squeue", "--json", f"--nodelist={node}"])) if not j.final]


async def node(name: str) -> SlurmNode | None:
    found = json.loads(await run(["sinfo", "--json", f"--nodes={name}"])).get("nodes") or []
    return next((SlurmNode.of(n) for n in found if n.get("name") == name), None)


async def submit(argv: list[str]) -> int:
    """sbatch --parsable ...: the new job's id."""
    out = (await run(["sbatch", "--parsable", *argv])).strip()
    try:
        return int(out.split(";")[0])
    except ValueError:
        raise SlurmError(f"sbatch answered {out[:200]!r}, not a job id") from None


async def signal_batch(job_id: int, signal: str) -> None:
    """A signal to the job's batch script only (scancel --batch): ADC's launcher turns it into the stop."""
    await run(["scancel", f"--signal={signal}", "--batch", str(job_id)])


async def cancel(job_id: int) -> None:
    await run(["scancel", str(job_id)])


def cancel_sync(job_id: int) -> None:
    try:
        run_sync(["scancel", str(job_id)])
    except SlurmError as err:
        log.warning("scancel %d: %s", job_id, err)
