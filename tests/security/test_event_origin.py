"""One worker key, other nodes' jobs: replayed against a real nats-server with ADC's authorization,
the real executor, decider and api on a real Postgres.

A worker publishes job events only on its own node's subject (`<prefix>.jobs.<node>.<job>.events`),
with message ids no other key can compute, and every reader takes a trainer's event only from a
node its attempt runs on. What another node's key tried, and must not achieve again:
- publish a job's exit id first, so JetStream dropped the real exit as a duplicate and the job
  stayed `running` holding its device;
- report comm latencies for a job on another node, so the decider checkpoint-stopped and
  restarted (tuned) it;
- add a loss point to that job's metrics.
"""

from __future__ import annotations

import asyncio
import json
import time

import nats.errors
import pytest
import pytest_asyncio

from shared.contracts.messages import JobEvent
from shared.contracts.subjects import API_SOURCE, Subjects
from shared.infra.bus_auth import permissions, worker_role
from shared.infra.rejections import count
from tests.conftest import Isolated
from tests.integration.api.conftest import api  # noqa: F401  (the fixture)
from tests.integration.decider.live_decider import LiveDecider
from tests.integration.executor.harness import Harness
from tests.security.test_bus_auth import connect_as, stream_messages
from worker.agent import NodeAgent
from worker.inventory import cpu_slots
from worker.trainer_process import JobFolder, TrainerProcess


@pytest.fixture(scope="module")
def env():
    e = Isolated(nodes=("n1", "n2")).open()
    yield e
    e.close()


def test_the_permission_table_gives_each_worker_only_its_own_nodes_event_subjects():
    s = Subjects("adc")
    assert s.job_events("*", "n1") in permissions(worker_role("n1"), s).publish
    assert not [p for p in permissions(worker_role("n1"), s).publish if ".jobs." in p and ".n1." not in p]
    assert [p for p in permissions("api", s).publish if ".jobs." in p] == [s.job_events("*", API_SOURCE)]
    assert s.event_source(s.job_events("j1", "n2")) == "n2" and s.event_source(s.decisions) is None


async def test_a_worker_key_publishes_job_events_only_on_its_own_nodes_subject(env):
    s = Subjects(env.prefix)
    worker, refusals = await connect_as(env, "worker-n2")
    try:
        before = await stream_messages(env, s.jobs_stream)
        for target in (s.job_events("j1", "n1"), s.job_events("j1", API_SOURCE)):  # another node's, the api's
            forged = JobEvent(job_id="j1", kind="exited", ts=time.time(), attempt=1, node="n1")
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await worker.js.publish(target, forged.encode(), timeout=1)
            await refusals.wait_for(target)
        own = JobEvent(job_id="j1", kind="progress", ts=time.time(), attempt=1, node="n2")
        await worker.publish_js(s.job_events("j1", "n2"), own, own.event_id)
        assert await stream_messages(env, s.jobs_stream) == before + 1
    finally:
        await worker.close()


# --- the exit a forged message id once dropped ---------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def ex(env):
    async with Harness(env) as harness:
        yield harness


async def test_another_nodes_key_cannot_have_a_jobs_exit_dropped_as_a_duplicate(ex, tmp_path):
    w, other = await ex.worker(), await ex.worker()
    job_id = await ex.running_job(w)
    attacker = await ex.reporter(f"worker-{other.node}")
    s = attacker.subjects
    # Every id the attacker could think of for the real exit: the scheme workers used, and its own key's.
    guesses = [f"{job_id}:1:exit", f"{job_id}:1:exit:0", attacker.private_msg_id(job_id, 1, "exit", 0)]
    for guess in guesses:
        forged = JobEvent(
            job_id=job_id,
            kind="exited",
            ts=ex.clock.now(),
            attempt=1,
            node=other.node,
            data={"outcome": "succeeded", "exit_code": 0, "node_rank": 0},
        )
        await attacker.publish_js(s.job_events(job_id, other.node), forged, guess, signed=True)
    await ex.until(lambda: ex.audited("event.ignored", job_id), "the forged exit ignored")
    assert (await ex.row(job_id))["status"] == "running"

    # The job's own worker reports its trainer's exit, as it does when the trainer ends.
    bus = await ex.reporter(f"worker-{w.node}")
    agent = NodeAgent(bus, w.node, cpu_slots(1), tmp_path)
    trainer = TrainerProcess(job_id, 1, [0], JobFolder(tmp_path / "jobs" / job_id))
    trainer.exit_code = 0
    await agent._report_exit(trainer, 0)
    assert agent.finished[(job_id, 1)].reported
    row = await ex.status_becomes(job_id, "succeeded")
    assert row["status_reason"].startswith("training finished")
    ignored = ex.audited("event.ignored", job_id)
    assert len({a.event_id for a in ignored}) == 1  # one audit row for the three forgeries (the sink keeps one per id)
    assert ignored[0].node == other.node and ignored[0].action == "exited"


async def test_a_worker_key_cannot_have_an_audit_event_dropped_as_a_duplicate(env):
    """A worker chooses the msg ids of its refusal reports; beside the audit events, in one stream,
    it could take a coming audit event's (deterministic) id and have that event dropped."""
    from shared.contracts.messages import AuditEvent, CommandRefusal

    worker, executor, admin = await env.bus("worker-n2"), await env.bus("executor"), await env.bus("admin")
    s = worker.subjects
    audit_id = f"victim-{env.prefix}:1:succeeded"  # how the executor names a transition's audit event
    try:
        report = CommandRefusal(ts=time.time(), reason="unsigned", claimed={})
        await worker.js.publish(s.command_refusals("n2"), report.encode(), headers={"Nats-Msg-Id": audit_id})
        await executor.audit(
            AuditEvent(
                event_id=audit_id,
                ts=time.time(),
                source="executor",
                kind="job.succeeded",
                job_id=f"victim-{env.prefix}",
                reason="training finished",
            )
        )
        kept = await admin.js.get_last_msg(s.audit_stream, s.audit)
        assert AuditEvent.decode(kept.data).event_id == audit_id
    finally:
        for bus in (worker, executor, admin):
            await bus.close()


# --- the restart a forged comm latency once caused ------------------------------------------


JITTER = {"n1": [100.0, 900.0, 120.0, 880.0]}  # far above comm_jitter's 50 us stddev


async def _report_latency(bus, job_id: str, node: str, claimed: str, attempt: int, steps: range) -> None:
    for step in steps:
        e = JobEvent(
            job_id=job_id,
            kind="progress",
            ts=time.time(),
            attempt=attempt,
            node=claimed,
            data={"step": step, "comm_latency_us": JITTER["n1"], "comm_latency_us_by_node": JITTER},
        )
        await bus.publish_js(bus.subjects.job_events(job_id, node), e, e.event_id, signed=True)


@pytest.fixture
def quiet_env():
    """An installation of its own: no executor carries out what the decider says."""
    e = Isolated(nodes=("n1", "n2")).open()
    yield e
    e.close()


async def test_comm_latency_from_another_nodes_key_moves_no_job(quiet_env, tmp_path):
    job_id = "victim-" + quiet_env.prefix
    async with LiveDecider(quiet_env, tmp_path) as d:
        await d.node("n1")
        await d.node("n2")
        await d.job(job_id, status="running", placement=[{"node": "n1", "gpus": [0]}])
        await d.wait_for(lambda: job_id in d.engine.source.book.jobs, what="the job in the decider's view")
        before = count("job_events", "not_placed") + count("job_events", "unauthenticated")
        attacker = await d._as("worker-n2")
        await _report_latency(attacker, job_id, "n2", "n2", 0, range(1, 13))  # as itself
        await _report_latency(attacker, job_id, "n2", "n1", 0, range(13, 25))  # claiming the job's node
        await d.wait_for(
            lambda: count("job_events", "not_placed") + count("job_events", "unauthenticated") >= before + 24,
            what="the forged events counted",
        )
        await asyncio.sleep(2.0)  # ten passes at controller.interval 0.2 s
        assert not [x for x in d.decisions if x.action.job_id == job_id], d.decisions
        # The control: the same latencies from the job's own node do move it, so the above proves something.
        await _report_latency(await d._as("worker-n1"), job_id, "n1", "n1", 0, range(25, 37))
        [decision] = await d.wait_for(
            lambda: [x for x in d.decisions if x.action.job_id == job_id],
            what="the decision on the job's own node's latencies",
        )
        assert decision.rule == "comm_jitter" and decision.action.action in ("tune", "migrate")


# --- the loss point a forged progress event once added ---------------------------------------


def test_a_loss_point_from_another_nodes_key_is_not_in_the_jobs_metrics(api):  # noqa: F811
    job = api.submit("user", name="measured")
    api.server.sql(
        "UPDATE jobs SET attempt = 1, placement = $2, status = 'running' WHERE id = $1",
        job["id"],
        [{"node": "node-1", "gpus": [0]}],
    )
    real, forged = api.server.as_role("worker-node-1"), api.server.as_role("worker-node-2")

    async def publish() -> None:
        for bus, node, step, loss in ((real, "node-1", 1, 2.0), (forged, "node-2", 2, 0.001), (real, "node-1", 3, 1.5)):
            e = JobEvent(
                job_id=job["id"],
                kind="progress",
                ts=time.time(),
                attempt=1,
                node=node,
                data={"step": step, "loss": loss},
            )
            await bus.publish_js(bus.subjects.job_events(job["id"], node), e, e.event_id, signed=True)

    before = count("job_events", "not_placed")
    api.server.run(publish())
    with api.client("user") as http:
        m = http.get(f"/v1/jobs/{job['id']}/metrics").json()
        assert [p["step"] for p in m["points"]] == [1, 3] and m["summary"]["min_loss"] == 1.5
        events = http.get(f"/v1/jobs/{job['id']}/events", params={"include_progress": "true"}).json()["items"]
        assert {e["node"] for e in events if e["kind"] == "progress"} == {"node-1"}
    assert count("job_events", "not_placed") >= before + 2  # once per read

    with (
        api.client("user") as http,
        http.stream("GET", "/v1/jobs/stream", params={"job_id": job["id"]}, timeout=30) as live,
    ):
        lines = live.iter_lines()
        assert next(lines).startswith("retry:")  # subscribed: what is published now is streamed
        api.server.run(publish())
        shown = []
        for line in lines:
            if line.startswith("data:") and '"step"' in line:
                shown.append(json.loads(line.removeprefix("data:"))["step"])
                if shown[-1] == 3:
                    break
    assert shown == [1, 3], shown
    api.server.sql("UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = $1", job["id"])


# --- an installation made before the per-node subjects ----------------------------------------


async def test_bus_init_moves_an_existing_jobs_stream_and_its_consumer_to_the_per_node_subjects():
    from nats.js.api import AckPolicy, ConsumerConfig

    from shared.infra.bus import consume, init_streams

    env = await asyncio.to_thread(Isolated(nodes=("n1",)).open)
    admin, executor, worker = await env.bus("admin"), await env.bus("executor"), await env.bus("worker-n1")
    s, durable = admin.subjects, admin.subjects.consumer("executor-jobs")
    old = f"{s.prefix}.jobs.*.events"  # what an older ADC made, and its executor's consumer read
    try:
        config = (await admin.js.stream_info(s.jobs_stream)).config
        config.subjects = [old]
        await admin.js.update_stream(config)
        await executor.js.add_consumer(
            s.jobs_stream, ConsumerConfig(durable_name=durable, filter_subject=old, ack_policy=AckPolicy.EXPLICIT)
        )
        await init_streams(env.nats_url, env.deployment)  # `adc bus init`
        assert (await admin.js.stream_info(s.jobs_stream)).config.subjects == [s.job_events()]

        got: list[bytes] = []

        async def handler(msg) -> None:
            got.append(msg.data)
            await msg.ack()

        stop = asyncio.Event()
        task = asyncio.create_task(consume(executor, s.jobs_stream, s.job_events(), durable, handler, stop))
        e = JobEvent(job_id="j1", kind="progress", ts=time.time(), attempt=1, node="n1")
        await worker.publish_js(s.job_events("j1", "n1"), e, e.event_id, signed=True)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert [JobEvent.decode(d).event_id for d in got] == [e.event_id]
        assert (await executor.js.consumer_info(s.jobs_stream, durable)).config.filter_subject == s.job_events()
    finally:
        for bus in (admin, executor, worker):
            await bus.close()
        await asyncio.to_thread(env.close)
