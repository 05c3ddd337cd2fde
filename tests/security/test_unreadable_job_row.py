"""One job's row stops no one else's scheduling: a decider on the real NATS and Postgres, with job rows
written directly in Postgres as the api and the executor never would (values its checks refuse).

Such a job is isolated: it is audited (`job.unreadable`) and, while pending, told why it waits; nothing
is decided from its values; a job holding devices keeps them counted. The pass goes on for every
other job, which starts on the idle GPUs.
"""

from __future__ import annotations

import json
import time

from shared.contracts.messages import AuditEvent
from tests.integration.decider.live_decider import LiveDecider

HUGE = "1" + "0" * 400  # max_steps as the api once accepted it: numeric in jsonb, out of range for float8


async def _raw_job(
    live: LiveDecider, job_id: str, spec_json: str, status: str = "pending", placement: list | None = None
) -> None:
    """A row the executor would not write: its spec as raw jsonb text; then what the api or executor says."""
    await live.pool.execute(
        "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, status,"
        " placement, started_at) VALUES ($1, $1, 'test', 'default', 'low', 1, ($2::text::jsonb->>'gpus')::int,"
        " true, $2::text::jsonb, $3, $4, CASE WHEN $3 = 'running' THEN now() END)",
        job_id,
        spec_json,
        status,
        placement,
    )
    kind = "job.submitted" if status == "pending" else f"job.{status}"
    await live.bus.audit(
        AuditEvent(
            event_id=f"{job_id}:{kind}",
            ts=time.time(),
            source="test",
            kind=kind,
            job_id=job_id,
            reason="set up by the test",
        )
    )


async def test_a_job_whose_row_cannot_be_read_is_isolated_and_the_pass_goes_on(isolated, tmp_path):
    async with LiveDecider(isolated, tmp_path, leases={"enabled": False}) as live:
        await live.node("a", gpus=4)
        await _raw_job(live, "bad-steps", f'{{"name": "bad-steps", "gpus": 1, "train": {{"max_steps": {HUGE}}}}}')
        await _raw_job(live, "bad-gpus", '{"name": "bad-gpus", "gpus": 1, "max_gpus": "many", "train": {}}')
        # Running on a:0 and a:1, with a value the decider cannot read: its devices stay taken.
        await _raw_job(
            live,
            "bad-running",
            '{"name": "bad-running", "gpus": 2, "min_gpus": 1e400, "train": {}}',
            status="running",
            placement=[{"node": "a", "gpus": [0, 1]}],
        )
        await live.job("good", gpus=2)

        [start] = await live.wait_for(
            lambda: [d for d in live.decisions if d.action.job_id == "good"],
            what="another team's job started",
            timeout=20,
        )
        assert start.action.action == "start"
        assert [p.gpus for p in start.action.placement] == [(2, 3)], start  # not the unreadable job's 0 and 1
        await live.wait_for(
            lambda: {a.job_id for a in live.audited("job.unreadable")} >= {"bad-steps", "bad-gpus", "bad-running"},
            what="the unreadable rows audited",
        )
        said = {a.job_id: a.reason for a in live.audited("job.unreadable")}
        assert "max_steps" in said["bad-steps"] and "max_gpus 'many'" in said["bad-gpus"], said
        assert "keeps its devices" in said["bad-running"], said
        entry = await live.pending_reason("bad-steps", "cannot read this job's row")
        assert "max_steps" in entry["reason"], entry
        assert not [d for d in live.decisions if d.action.job_id.startswith("bad-")], live.decisions
        print(json.dumps(said, indent=1))
