"""A job's trainer log: the whole file or its last lines, and follow mode (like `tail -f`) until
the job ends, moving on to a new attempt's log when the job restarts.

The log is `<job_dir>/attempt-<N>/trainer.log` on the storage the workers share with the api.
`job_dir` comes from the executor, never from the caller, and the path must resolve inside
`storage.root`: a row pointing elsewhere gets 404, not a file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import StreamingResponse

from services.api.auth import Principal, authenticate
from services.api.errors import AUTHENTICATED, NOT_FOUND
from services.api.jobs import JOB_ID, visible_job
from shared.contracts.job_status import JobStatus
from shared.infra.job_reads import one_job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

CHUNK = 64 * 1024
FOLLOW_POLL_S = 0.5


def log_file(state, job_dir: str | None, attempt: int) -> Path | None:
    """Where an attempt's log is, or None if the job has no folder yet."""
    if not job_dir or attempt < 1:
        return None
    root = Path(state.config.storage.root).resolve()
    path = (Path(job_dir) / f"attempt-{attempt}" / "trainer.log").resolve()
    if not path.is_relative_to(root):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "the job's folder is not on storage shared with the api")
    return path


def tail_offset(path: Path, lines: int) -> int:
    """The byte offset where the last `lines` lines of the file begin."""
    with path.open("rb") as f:
        end = f.seek(0, 2)
        if lines <= 0 or end == 0:
            return end
        pos, seen = end, 0
        # A final newline ends the last line; it does not start another.
        f.seek(end - 1)
        limit = end - 1 if f.read(1) == b"\n" else end
        while pos > 0:
            step = min(CHUNK, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)[: max(0, limit - pos)]
            i = len(block)
            while (i := block.rfind(b"\n", 0, i)) != -1:
                seen += 1
                if seen == lines:
                    return pos + i + 1
        return 0


def _read(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(CHUNK)
    except FileNotFoundError:
        return b""


@router.get(
    "/{job_id}/logs",
    response_class=StreamingResponse,
    responses=AUTHENTICATED | NOT_FOUND | {200: {"content": {"text/plain": {}}, "description": "the trainer's log"}},
    summary="The trainer log of a job: all of it or the last lines; follow streams until the job ends",
)
async def job_logs(
    request: Request,
    job_id: str = JOB_ID,
    who: Principal = Depends(authenticate),
    attempt: int | None = Query(
        None, ge=1, le=1_000_000, description="default: the current attempt (and, following, the next ones)"
    ),
    tail: int | None = Query(None, ge=0, le=1_000_000, description="only the last N lines"),
    follow: bool = Query(False, description="keep streaming new lines until the job ends"),
):
    state = request.app.state
    row = await visible_job(request, job_id, who)
    current = attempt or row["attempt"]
    if attempt is not None and attempt > row["attempt"]:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has had {row['attempt']} attempt(s)")
    path = log_file(state, row["job_dir"], current)
    if not follow and (path is None or not path.exists()):
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no log yet for job {job_id} ({row['status']})"
            if path is None
            else f"no log for attempt {current} of job {job_id}",
        )
    start = await asyncio.to_thread(tail_offset, path, tail) if tail is not None and path and path.exists() else 0

    async def lines():
        nonlocal current, path
        offset = start
        while True:
            if path is not None:
                data = await asyncio.to_thread(_read, path, offset)
                if data:
                    offset += len(data)
                    yield data
                    continue
            if not follow:
                return
            job = await one_job.log_cursor(state.pool, job_id)
            if attempt is None and job.attempt > current:  # restarted, migrated or resumed: follow it
                current, offset = job.attempt, 0
                yield f"--- attempt {current} ---\n".encode()
                path = log_file(state, job.job_dir, current)
                continue
            if path is None and job.job_dir:
                path = log_file(state, job.job_dir, current)
                continue
            if JobStatus(job.status).terminal or (attempt is not None and job.attempt > attempt):
                if path is not None and (rest := await asyncio.to_thread(_read, path, offset)):
                    offset += len(rest)
                    yield rest
                    continue
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    if not follow:
        return StreamingResponse(lines(), media_type="text/plain; charset=utf-8", headers={"Cache-Control": "no-store"})
    state.streams.admit(who)
    return StreamingResponse(
        state.streams.guard(request, who, lines(), lambda why: f"--- stream ended: {why} ---\n".encode()),
        media_type="text/plain; charset=utf-8",
        headers={"Cache-Control": "no-store"},
    )
