"""The decider's view of the live jobs, kept from what it hears instead of re-read each pass.

Postgres stays the truth (the api and the executor write it); this is a cache of the live jobs
(pending, and those holding devices) as rules see them, `JobView`s, that a pass refreshes in
proportion to what changed:
- every job the bus says changed is re-read by id: the executor audits each transition after it
  committed it (`job.<status>`), the api audits a submission, a cancel or a move request
  (`job.submitted`, ...), and the decider marks the jobs it decided about;
- progress, which the executor records without a transition, is applied from the trainer's
  events themselves (current attempt, one of the job's nodes, as the executor checks); a
  checkpoint's time too, and the job is read again a pass later for the step the executor kept;
- a job named by an event but not found yet (the api publishes `job.submitted` inside its
  transaction, so it can arrive before the commit) is looked for again for `MISSING_GRACE_S`;
- every `reconcile_s` the whole set is read again and replaces the cache: whatever a lost
  message left wrong is repaired then, and counted. That read runs beside the passes (a pass
  that finds it done takes its result), so no pass waits for 4,000 rows; a first read, a change
  of priority levels and `expire` read whole within the pass, before it decides.

A pending job waiting for another (`after`) that has not succeeded is left out of the view too
(waiting_jobs.py), so no rule can place it.

A row with a value the decider cannot read (written around the api's checks) is isolated, not fatal:
it is noted in `unreadable` (the engine audits it and gives it a pending reason); a pending one is left
out of the view, so nothing is decided from its values; one holding devices stays, its unreadable
values absent, so its devices are not taken for free. Every other job is read and decided as ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace

import asyncpg

from services.decider.job_rows import PlacementCache, job_from_row, live_statuses, read_count
from services.decider.snapshot import JobView
from services.decider.waiting_jobs import WaitingJobs
from shared.contracts.job_status import JobStatus
from shared.infra.job_reads.rule_rows import rule_rows_in, rule_rows_of

log = logging.getLogger(__name__)
CHUNK = 50  # rows of a background read made views at a time: each a few ms of the event loop, so
# an urgent pass waiting on Postgres or the bus meanwhile is not held up behind a long stretch
MISSING_GRACE_S = 10.0  # how long a job named by an event is looked for before it is taken as gone


class JobBook(WaitingJobs):
    def __init__(self, pool: asyncpg.Pool, reconcile_s: float, checkpoints: Mapping[str, float]) -> None:
        self.pool = pool
        self.reconcile_s = reconcile_s
        self.checkpoints = checkpoints  # job -> newest checkpoint time, kept by the cluster view
        self.placements = PlacementCache()
        self.jobs: dict[str, JobView] = {}
        self.unreadable: dict[str, tuple[JobStatus, str]] = {}  # job -> (its status, what could not be read)
        self._spec_max_steps: dict[str, int | None] = {}
        self._dirty: set[str] = set()
        self._next: set[str] = set()  # re-read at the pass after the next one ...
        self._due: set[str] = set()  # ... i.e. at this one
        self._missing: dict[str, float] = {}  # job -> when first looked for and not found
        self._levels: dict[str, int] | None = None
        self._reconciled_at = float("-inf")
        self._background: asyncio.Task | None = None  # a periodic reconcile's read, beside the passes
        self._since_read: tuple[set[str], dict] | None = None  # while it runs: jobs re-read by id, progress applied
        self._live = set(live_statuses())
        self._reading = asyncio.Lock()  # two passes' reads are applied in the order they were made
        self.version = 0  # moves whenever a job's status or placement changed (or may have: a reconcile)
        self.reconciles = 0
        self.repaired = 0  # jobs a reconcile found different from the cache, over its life
        self.reads = 0  # rows re-read by id, over its life

    # --- what the bus says -----------------------------------------------------------

    def changed(self, job_id: str) -> None:
        """Something about this job changed in Postgres (or is about to): re-read it next pass."""
        self._dirty |= {job_id, *self._waiting_for(job_id)}

    def progress(self, job_id: str, attempt: int, node: str, data: Mapping) -> None:
        """A progress event: the executor stores exactly these keys as the job's progress, when the
        event is of the current attempt and from one of the job's nodes."""
        if self._since_read is not None:  # newer than the whole read under way: applied again over it
            self._since_read[1][job_id] = (attempt, node, data)
        job = self.jobs.get(job_id)
        if job is None or job.attempt != attempt or node not in job.nodes():
            return
        self.jobs[job_id] = with_progress(job, data, self._spec_max_steps.get(job_id))

    def runs_on(self, job_id: str, attempt: int, node: str | None) -> bool | None:
        """Whether the job's current attempt runs on `node`, as this cache has it; None for a job not in it."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return job.attempt == attempt and node in job.nodes()

    def checkpointed(self, job_id: str) -> None:
        """A checkpointed event: its time now (the cluster view keeps it); its step once the executor
        has judged it (a path outside the job's folder, another node's word: refused), so the job is
        read again at the pass after next."""
        job = self.jobs.get(job_id)
        if job is not None:
            self.jobs[job_id] = replace(job, last_checkpoint_at=self.checkpoints.get(job_id))
        self._next.add(job_id)

    def expire(self) -> None:
        """Read everything again at the next pass (e.g. when this decider starts leading)."""
        self._reconciled_at = float("-inf")
        if self._background is not None:
            self._background.cancel()
            self._background, self._since_read = None, None

    # --- a pass ----------------------------------------------------------------------

    async def refresh(self, now: float, levels: dict[str, int], whole: bool = True) -> tuple[JobView, ...]:
        """The live jobs as of now: re-read what changed, or everything when a reconcile is due.
        `whole=False`: the periodic reconcile is neither started nor taken up (a regular pass does)."""
        async with self._reading:
            return await self._refresh(now, levels, whole)

    async def _refresh(self, now: float, levels: dict[str, int], whole: bool) -> tuple[JobView, ...]:
        if levels != self._levels or self._reconciled_at == float("-inf"):
            await self._reconcile(now, levels)  # (a read under way, made with the old levels, is dropped)
            return tuple(self.jobs.values())
        if whole and self._background is None and now - self._reconciled_at >= self.reconcile_s:
            self._since_read = (set(), {})
            self._background = asyncio.ensure_future(self._read_all(levels, chunk=CHUNK))
        elif whole and self._background is not None and self._background.done():
            (reread, progressed), read = self._since_read, self._background
            self._background, self._since_read = None, None
            try:
                self._apply(now, levels, *read.result(), excused=reread | progressed.keys())
            except Exception as err:  # noqa: BLE001 - the next one tries again; the events keep the view meanwhile
                log.warning("reconcile failed: %s", err)
                self._reconciled_at = now
            else:  # what the view learnt while the read ran is newer than it
                self._dirty |= reread
                for job_id, (attempt, node, data) in progressed.items():
                    self.progress(job_id, attempt, node, data)
        await self._reread(now)
        return tuple(self.jobs.values())

    async def reconcile(self, now: float, levels: dict[str, int]) -> int:
        """Read every live job again; returns how many the cache had wrong (new, gone or changed)."""
        async with self._reading:
            return await self._reconcile(now, levels)

    async def _reconcile(self, now: float, levels: dict[str, int]) -> int:
        if self._background is not None:  # this read is newer than the one under way
            self._background.cancel()
            self._background, self._since_read = None, None
        return self._apply(now, levels, *await self._read_all(levels))

    async def _read_all(self, levels: dict[str, int], chunk: int = 0) -> tuple[set[str], list, dict[str, JobView]]:
        """Every live job as read now, and which jobs events had named before the read began. With
        `chunk`, the rows become views a chunk at a time, letting the event loop in between."""
        dirty = set(self._dirty)
        rows = await rule_rows_in(self.pool, sorted(self._live))
        fresh = {}
        for i, r in enumerate(rows):
            if (job := self._view(r, levels)) is not None:
                fresh[r["id"]] = job
            if chunk and i % chunk == chunk - 1:
                await asyncio.sleep(0)
        return dirty, rows, fresh

    def _apply(
        self,
        now: float,
        levels: dict[str, int],
        dirty: set[str],
        rows: list,
        fresh: dict[str, JobView],
        excused: set[str] = frozenset(),
    ) -> int:
        """Replace the cache with a whole read; jobs named by events since it began are read again by id.
        Repairs are counted but for the jobs events named (`dirty`, `excused`: newer than the read)."""
        wrong = {j for j in fresh.keys() | self.jobs.keys() if fresh.get(j) != self.jobs.get(j)} - dirty - excused
        if wrong and self._levels == levels and self.reconciles:
            log.warning(
                "reconcile: %d job(s) differed from what the events said (%s); repaired",
                len(wrong),
                ", ".join(sorted(wrong)[:5]),
            )
            self.repaired += len(wrong)
        self.jobs = fresh
        self.version += 1
        self._spec_max_steps = {r["id"]: read_count(r["spec_max_steps"]) for r in rows}
        listed = {r["id"] for r in rows}
        self.unreadable = {j: why for j, why in self.unreadable.items() if j in listed}
        self._keep_waiting(listed)
        self._levels = dict(levels)
        self._dirty -= dirty
        self._missing = {j: t for j, t in self._missing.items() if j not in fresh and now - t < MISSING_GRACE_S}
        self._reconciled_at = now
        self.reconciles += 1
        return len(wrong)

    async def _reread(self, now: float) -> None:
        ids = self._dirty | set(self._missing) | self._due
        self._due, self._next = self._next, set()
        if not ids:
            return
        self._dirty = set()
        if self._since_read is not None:
            self._since_read[0].update(ids)
        rows = await rule_rows_of(self.pool, sorted(ids))
        self.reads += len(rows)
        found = set()
        for r in rows:
            job_id = r["id"]
            found.add(job_id)
            self._missing.pop(job_id, None)
            if r["status"] in self._live and (job := self._view(r, self._levels or {})) is not None:
                before = self.jobs.get(job_id)
                if before is None or (before.status, before.placement) != (job.status, job.placement):
                    self.version += 1
                self.jobs[job_id] = job
                self._spec_max_steps[job_id] = read_count(r["spec_max_steps"])
            else:
                self._forget(job_id)
                if r["status"] not in self._live:
                    self.unreadable.pop(job_id, None)
                    self.waiting.pop(job_id, None)
        for job_id in ids - found:  # not there (yet): a submission not committed, or a deleted job
            first = self._missing.setdefault(job_id, now)
            if now - first >= MISSING_GRACE_S:
                del self._missing[job_id]
            self._forget(job_id)

    def _view(self, r, levels: dict[str, int]) -> JobView | None:
        """The row as rules see it, or None for a pending job with a value that cannot be read (noted)."""
        if self._held(r):  # waits for a job that has not succeeded: no rule may place it
            return None
        problems: list[str] = []
        job = job_from_row(r, levels, self.checkpoints, self.placements, problems)
        if not problems:
            self.unreadable.pop(job.id, None)
            return job
        if self.unreadable.get(job.id) != (job.status, "; ".join(problems)):
            log.warning("job %s: its row cannot be read (%s); left out of decisions", job.id, "; ".join(problems))
        self.unreadable[job.id] = (job.status, "; ".join(problems))
        return None if job.status == JobStatus.PENDING else job  # one holding devices stays: they are taken

    def _forget(self, job_id: str) -> None:
        if self.jobs.pop(job_id, None) is not None:
            self.version += 1
        self._spec_max_steps.pop(job_id, None)


def with_progress(job: JobView, data: Mapping, spec_max_steps: int | None) -> JobView:
    """The job as a progress event's keys leave it (the spec's max_steps, when it has one, wins)."""
    max_steps = spec_max_steps if spec_max_steps is not None else read_count(data.get("max_steps"))
    return replace(
        job,
        step=read_count(data.get("step")),
        step_time_s=_float(data.get("step_time_s")),
        peak_memory_bytes=read_count(data.get("peak_memory_bytes")),
        max_steps=max_steps if (max_steps or 0) > 0 else None,
    )


# A trainer's event crosses a boundary: a value that is not a number counts as absent.
def _float(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):
        return None
