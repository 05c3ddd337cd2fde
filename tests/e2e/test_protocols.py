"""Migrate, pause/resume, drain, node loss, scale and an executor crash mid-migration, on real
training: each ends with weights bit-identical to an uninterrupted run (or, after a crash,
loses at most `save_steps`)."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from safetensors.torch import load_file

from shared.contracts.actions import NodeGpus, Scale
from shared.contracts.messages import Decision
from tests.e2e.conftest import running_stack
from tests.e2e.test_loop import lora_job
from tests.waits import until

STEPS, SAVE_STEPS = 150, 20
DONE = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    # comm_jitter off: two ranks sharing two busy cores jitter far beyond the seed's 50 us, and these
    # tests move jobs themselves (the rule has its own tests in tests/decider).
    yield from running_stack(
        tmp_path_factory,
        workers=2,
        cpu_slots=2,
        controller={"timeout": 30},
        worker={"node_timeout": 5},
        strategies={"comm_jitter": {"enabled": False}},
    )


def spec(tiny_model, data_dir, name):
    s = lora_job(tiny_model, data_dir, name=name, steps=STEPS)
    s["train"]["save_steps"] = SAVE_STEPS
    return s


def adapter(job: dict) -> dict:
    return load_file(str(Path(job["output_dir"]) / "adapter_model.safetensors"))


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst == 0.0, f"max abs diff {worst}"


class Reference:
    """The uninterrupted twin of the module's jobs (same spec), submitted when first asked for and left
    alone: it trains beside the first test's job, which moves only itself. A test that stops or moves
    other jobs (a drain, a killed worker or executor) calls `weights()` before it acts, so the twin is
    done and untouched by then."""

    def __init__(self, live, job_id: str) -> None:
        self.live, self.job_id, self._weights = live, job_id, None

    def weights(self) -> dict:
        if self._weights is None:
            done = self.live.wait_for(self.job_id, DONE, timeout=300)
            assert done["status"] == "succeeded", done
            self._weights = adapter(done)
        return self._weights


@pytest.fixture(scope="module")
def reference(live, tiny_model, data_dir) -> Reference:
    return Reference(live, live.submit(spec(tiny_model, data_dir, "reference"))["id"])


def wait_step(live, job_id: str, step: int, timeout: float = 300, attempt: int = 1) -> dict:
    """The job once its `attempt` (or a later one) runs at `step` or later; it may not end first.
    The timeout only bounds a hung run: ranks that start on a loaded host can take minutes."""
    seen = {}

    def at_step():
        seen.update(live.job(job_id))
        assert seen["status"] not in DONE, seen
        running = seen["status"] == "running" and seen["attempt"] >= attempt
        return running and (seen["progress"] or {}).get("step", 0) >= step and dict(seen)

    return until(at_step, lambda: f"{job_id} running attempt {attempt} at step {step}: {seen}", timeout)


def wait_stopping(live, job_id: str, timeout: float = 180) -> None:
    """Until the executor has begun a protocol's checkpoint-stop for the job."""
    until(
        lambda: live.sql("SELECT 1 FROM protocols WHERE job_id = $1 AND step = 'stopping'", job_id),
        lambda: f"a checkpoint-stop of {job_id} begun; its audit: {[e['kind'] for e in live.audit(job_id=job_id)]}",
        timeout,
        poll=0.05,
    )


def node_ready(live, node: str, timeout: float = 60) -> None:
    until(
        lambda: live.sql("SELECT status FROM nodes WHERE id = $1", node)[0]["status"] == "ready",
        f"{node} ready again",
        timeout,
    )


def statuses(live, job_id: str) -> list[str]:
    return [
        r["new_status"]
        for r in live.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job_id)
    ]


def test_migrate_mid_training_is_bit_identical(live, reference, tiny_model, data_dir):
    job = live.submit(spec(tiny_model, data_dir, "migrate-me"))
    running = wait_step(live, job["id"], 25)
    source = running["placement"][0]["node"]
    target = "node-2" if source == "node-1" else "node-1"
    with live.trainer_held(running["id"]):
        r = live.http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})
        assert r.status_code == 202, r.text
        wait_stopping(live, job["id"])
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert done["placement"][0]["node"] == target and done["attempt"] == 2
    assert_bit_identical(adapter(done), reference.weights())
    assert statuses(live, job["id"]) == [
        "pending",
        "scheduled",
        "starting",
        "running",
        "checkpointing",
        "migrating",
        "starting",
        "running",
        "succeeded",
    ]
    kinds = [e["kind"] for e in live.audit(job_id=job["id"])]
    for kind in ("protocol.started", "protocol.prepared", "command.stop", "protocol.resumed", "protocol.done"):
        assert kind in kinds, kinds
    # Warm: the target's trainer was ready before the source was asked to stop, and took the go.
    assert kinds.index("protocol.prepared") < kinds.index("command.stop") < kinds.index("protocol.resumed")
    [resumed] = live.audit(job_id=job["id"], kind="protocol.resumed")
    assert resumed["data"]["ok"] and resumed["data"]["warm"], resumed
    launched = json.loads((Path(done["job_dir"]) / "attempt-2" / "launch.json").read_text())
    assert launched["warm"] is True and launched["resume_from"] is None, launched
    assert json.loads((Path(done["job_dir"]) / "attempt-2" / "go").read_text())["resume_from"] == stop_checkpoint(
        live, job
    )
    stop = next(e for e in live.audit(job_id=job["id"], kind="command.stop"))
    assert (
        stop["data"]["ok"]
        and stop["data"]["step"] >= 25
        and stop["data"]["checkpoint"].endswith(f"checkpoint-{stop['data']['step']}")
    )
    # The operator asked; the decider chose the devices (its drain rule) and named the request.
    [asked] = live.audit(job_id=job["id"], kind="job.move_requested")
    assert "admin" in asked["actor"] and asked["node"] == target
    [decided] = [e for e in live.audit(job_id=job["id"], kind="decision") if e["rule"] == "drain"]
    assert decided["evidence"]["request_id"] == asked["data"]["request_id"] and decided["action"] == "migrate"


def stop_checkpoint(live, job: dict) -> str:
    return next(e for e in live.audit(job_id=job["id"], kind="command.stop"))["data"]["checkpoint"]


def kill_trainer_of(job_id: str, attempt: int, timeout: float = 120) -> None:
    """SIGKILL to the process group of the job's trainer of `attempt`, once it exists (found by its environment)."""
    wanted = (f"ADC_JOB_ID={job_id}".encode(), f"ADC_ATTEMPT={attempt}".encode())

    def trainer_pid() -> int | None:
        for proc in Path("/proc").iterdir():
            try:
                if all(w in (proc / "environ").read_bytes().split(b"\0") for w in wanted):
                    return int(proc.name)
            except (OSError, ValueError):
                continue
        return None

    os.killpg(os.getpgid(until(trainer_pid, f"a trainer of {job_id} attempt {attempt}", timeout)), signal.SIGKILL)


def test_a_target_that_dies_while_preparing_leaves_the_source_training(live, reference, tiny_model, data_dir):
    job = live.submit(spec(tiny_model, data_dir, "target-dies"))
    running = wait_step(live, job["id"], 20)
    source = running["placement"][0]["node"]
    target = "node-2" if source == "node-1" else "node-1"
    with live.trainer_held(running["id"]):
        r = live.http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})
        assert r.status_code == 202, r.text
        kill_trainer_of(job["id"], 2)
        live.wait_audit(lambda t: t, timeout=120, job_id=job["id"], kind="protocol.prepare_failed")
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded" and done["attempt"] == 1 and done["placement"][0]["node"] == source, done
    assert_bit_identical(adapter(done), reference.weights())  # the source trained on: nothing lost
    kinds = [e["kind"] for e in live.audit(job_id=job["id"])]
    assert "command.stop" not in kinds and "protocol.rolled_back" in kinds, kinds
    assert "checkpointing" not in statuses(live, job["id"])


def test_pause_then_resume_is_bit_identical(live, reference, tiny_model, data_dir):
    job = live.submit(spec(tiny_model, data_dir, "pause-me"))
    running = wait_step(live, job["id"], 20)
    with live.trainer_held(running["id"]):
        assert live.http.post(f"/v1/jobs/{job['id']}/pause").status_code == 202
        wait_stopping(live, job["id"])
    paused = live.wait_for(job["id"], {"paused"} | DONE, timeout=60)
    assert paused["status"] == "paused" and paused["placement"] is None and paused["last_checkpoint"]
    # Held, not rescheduled: once the decider has started a job submitted after the pause, it has
    # passed over the paused one with room free for it.
    later = live.submit(spec(tiny_model, data_dir, "after-the-pause"))
    live.wait_audit(lambda trail: trail, job_id=later["id"], kind="decision", timeout=60)
    assert live.http.post(f"/v1/jobs/{later['id']}/cancel").status_code == 202
    assert live.job(job["id"])["status"] == "paused"
    assert [e["action"] for e in live.audit(job_id=job["id"], kind="decision")].count("start") == 1
    assert live.http.post(f"/v1/jobs/{job['id']}/pause").status_code == 409
    assert live.http.post(f"/v1/jobs/{job['id']}/resume").status_code == 202
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert_bit_identical(adapter(done), reference.weights())
    assert "paused" in statuses(live, job["id"])


def test_drain_moves_jobs_off_and_leaves_the_node_empty(live, reference, tiny_model, data_dir):
    reference.weights()  # the twin is done before this test stops or moves anything else
    job = live.submit(spec(tiny_model, data_dir, "drain-me"))
    running = wait_step(live, job["id"], 20)
    node = running["placement"][0]["node"]
    with live.trainer_held(running["id"]):
        assert live.http.post(f"/v1/nodes/{node}/drain").status_code == 202
        wait_stopping(live, job["id"])
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded" and done["placement"][0]["node"] != node, done
    assert_bit_identical(adapter(done), reference.weights())
    nodes = {n["id"]: n for n in live.http.get("/v1/nodes").json()["items"]}
    assert nodes[node]["status"] == "cordoned" and all(d["job_id"] is None for d in nodes[node]["devices"])
    live.wait_audit(lambda trail: trail, node=node, kind="node.cordoned")
    assert live.http.post(f"/v1/nodes/{node}/uncordon").status_code == 202
    node_ready(live, node)


def test_scale_one_to_two_ranks_keeps_the_global_batch(live, tiny_model, data_dir):
    s = spec(tiny_model, data_dir, "scale-me")
    s["train"]["gradient_accumulation_steps"] = 2  # global batch 2 x 2 x 1 = 4
    job = live.submit(s)
    running = wait_step(live, job["id"], 10)
    node = running["placement"][0]["node"]
    _publish_decision(
        live, Scale(job_id=job["id"], placement=[NodeGpus(node=node, gpus=(0, 1))], reason="test: grow to 2 ranks")
    )
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert len(done["placement"][0]["gpus"]) == 2
    events = Path(done["job_dir"]) / f"attempt-{done['attempt']}" / "events.jsonl"
    started = next(
        json.loads(line) for line in events.read_text().splitlines() if json.loads(line)["event"] == "started"
    )
    assert started["world_size"] == 2
    # 2 ranks x micro-batch 2 x accumulation 1 = the global batch of 4 it started with.
    assert started["global_batch_size"] == 4 and started["gradient_accumulation_steps"] == 1, started
    assert "resizing" in statuses(live, job["id"])


def test_executor_killed_mid_migration_completes_it_once(live, reference, tiny_model, data_dir):
    reference.weights()  # the twin is done before this test stops or moves anything else
    job = live.submit(spec(tiny_model, data_dir, "crash-mid-move"))
    running = wait_step(live, job["id"], 20)
    source = running["placement"][0]["node"]
    with live.trainer_held(running["id"]):  # the job may not finish on its source while the executor is away
        assert live.http.post(f"/v1/jobs/{job['id']}/migrate", json={}).status_code == 202
        until(
            lambda: live.sql("SELECT 1 FROM protocols WHERE job_id = $1", job["id"]),
            f"a protocol row for {job['id']}",
            poll=0.05,
        )
        live.stack.kill("executor")  # returns once the process is gone
        live.stack.restart("executor")
        wait_stopping(live, job["id"])  # the new executor carried the move on (a warm target got ready first)
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert done["placement"][0]["node"] != source
    assert_bit_identical(adapter(done), reference.weights())
    history = statuses(live, job["id"])
    assert history.count("migrating") == 1 and history.count("checkpointing") == 1, history
    protos = live.sql("SELECT state FROM protocols WHERE job_id = $1", job["id"])
    assert [p["state"] for p in protos] == ["done"]


def test_kill_9_of_a_worker_resumes_elsewhere_losing_at_most_save_steps(live, tiny_model, data_dir):
    job = live.submit(spec(tiny_model, data_dir, "lose-a-node"))
    running = wait_step(live, job["id"], SAVE_STEPS + 10)
    node = running["placement"][0]["node"]
    # The node dies: its worker and its trainer, at once.
    record = live.trainer_record(job["id"], node)
    live.stack.kill(f"worker-{node}")
    os.killpg(record["pid"], signal.SIGKILL)
    step_at_death = live.job(job["id"])["progress"]["step"]
    dead = {f"worker-{node}"}
    requeued = live.wait_for(job["id"], {"pending", "scheduled", "starting"} | DONE, timeout=60, may_be_dead=dead)
    assert requeued["status"] in {"pending", "scheduled", "starting"}, requeued
    done = live.wait_for(job["id"], DONE, timeout=300, may_be_dead=dead)
    assert done["status"] == "succeeded", done
    assert done["placement"][0]["node"] != node
    resumed = next(e for e in live.audit(job_id=job["id"], kind="job.pending") if "was lost" in (e["reason"] or ""))
    resume_step = resumed["data"]["resume_step"]
    assert resume_step is not None and step_at_death - resume_step <= SAVE_STEPS, (step_at_death, resume_step)
    assert any(e["node"] == node for e in live.audit(kind="node.lost"))
    live.stack.restart(f"worker-{node}")  # the node comes back and is ready again, not double-booked
    node_ready(live, node)


def test_a_killed_workers_trainer_dies_with_it_and_the_job_resumes_from_its_checkpoint(
    live, reference, tiny_model, data_dir
):
    reference.weights()  # the twin is done before this test stops or moves anything else
    job = live.submit(spec(tiny_model, data_dir, "orphan-check"))
    running = wait_step(live, job["id"], SAVE_STEPS + 5)  # a periodic checkpoint is on disk
    node = running["placement"][0]["node"]
    record = live.trainer_record(job["id"], node)
    live.stack.kill(f"worker-{node}")  # SIGKILL: its trainer (bwrap --die-with-parent) goes with it
    # No orphan: nothing runs unwatched.
    until(lambda: not process_exists(record["pid"]), f"the trainer {record['pid']} gone with its worker", timeout=30)
    live.stack.restart(f"worker-{node}")
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert_bit_identical(adapter(done), reference.weights())  # resumed from its checkpoint: nothing lost
    history = statuses(live, job["id"])
    assert history[:5] == ["pending", "scheduled", "starting", "running", "pending"], history
    requeues = [e["reason"] for e in live.audit(job_id=job["id"], kind="job.pending")]
    # Requeued once: by the restarted worker reporting it stopped at its newest checkpoint, or (when the restart
    # outlasted the node timeout) by node loss.
    assert len(requeues) == 1 and ("stopped after checkpoint" in requeues[0] or "was lost" in requeues[0]), requeues


def test_multi_node_job_runs_as_one_and_moves_as_one(live, tiny_model, data_dir):
    """A 2-rank job moved from one node onto two nodes (one rank each) meets at rank 0's node and
    finishes as one job; it is stopped and started as one."""
    s = spec(tiny_model, data_dir, "spread-me")
    s.update(gpus=2, multi_node=True)
    job = live.submit(s)
    running = wait_step(live, job["id"], 10)
    assert len(running["placement"]) == 1 and len(running["placement"][0]["gpus"]) == 2
    from shared.contracts.actions import Migrate

    with live.trainer_held(job["id"]):  # the move (warm: its targets get ready first) begins before the job ends
        _publish_decision(
            live,
            Migrate(
                job_id=job["id"],
                reason="test: spread over two nodes",
                placement=[NodeGpus(node="node-1", gpus=(1,)), NodeGpus(node="node-2", gpus=(1,))],
            ),
        )
        wait_stopping(live, job["id"])
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert [p["node"] for p in done["placement"]] == ["node-1", "node-2"]
    attempt_dir = Path(done["job_dir"]) / f"attempt-{done['attempt']}"
    started = next(
        json.loads(line)
        for line in (attempt_dir / "events.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "started"
    )
    assert started["world_size"] == 2 and started["step"] > 0
    assert (attempt_dir / "trainer.log").exists() and (attempt_dir / "trainer-node1.log").exists()
    starts = [e for e in live.audit(job_id=job["id"], kind="command.start") if e["data"]["attempt"] == done["attempt"]]
    assert len(starts) == 1 and starts[0]["data"]["ok"]


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _publish_decision(live, action) -> None:
    import asyncio

    async def publish():
        bus = await live.env.bus("decider")  # a decision, as the decider publishes it
        try:
            d = Decision(
                decision_id=uuid.uuid4().hex, ts=time.time(), rule="test", action=action, snapshot_ts=time.time()
            )
            await bus.publish_js(bus.subjects.decisions, d, d.decision_id)
        finally:
            await bus.close()

    asyncio.run(publish())


def test_tune_restarts_in_place_with_new_nccl_settings_losing_nothing(live, reference, tiny_model, data_dir):
    reference.weights()  # the twin is done before this test stops or moves anything else
    from shared.contracts.actions import Tune

    job = live.submit(spec(tiny_model, data_dir, "tune-me"))
    running = wait_step(live, job["id"], 20)
    _publish_decision(
        live, Tune(job_id=job["id"], env={"NCCL_ALGO": "Ring", "NCCL_SOCKET_NTHREADS": "4"}, reason="test: comm jitter")
    )
    # Past the tuned restart's checkpoint (20), and early: the move below must land before step 150.
    tuned = wait_step(live, job["id"], 22, timeout=240, attempt=2)
    assert tuned["placement"] == running["placement"]
    # A later move keeps the tuned settings: they belong to the job now, not to one start.
    with live.trainer_held(tuned["id"]):
        assert live.http.post(f"/v1/jobs/{job['id']}/migrate", json={}).status_code == 202
        wait_stopping(live, job["id"])
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded" and done["attempt"] == 3, done
    for attempt in (2, 3):
        launched = json.loads((Path(done["job_dir"]) / f"attempt-{attempt}" / "launch.json").read_text())
        assert launched["env"]["NCCL_ALGO"] == "Ring", (attempt, launched)
    assert_bit_identical(adapter(done), reference.weights())


def test_target_that_fails_to_start_rolls_back_to_the_source(live, reference, tiny_model, data_dir):
    reference.weights()  # the twin is done before this test stops or moves anything else
    job = live.submit(spec(tiny_model, data_dir, "rollback-me"))
    running = wait_step(live, job["id"], 20)
    source = running["placement"][0]["node"]
    target = "node-2" if source == "node-1" else "node-1"
    # The target dies only once the executor has accepted the move: it still looks ready then, and
    # nobody answers there.
    with live.trainer_held(running["id"]):
        r = live.http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})
        assert r.status_code == 202, r.text
        wait_stopping(live, job["id"])
        live.stack.kill(f"worker-{target}")
    try:
        done = live.wait_for(job["id"], DONE, timeout=300, may_be_dead={f"worker-{target}"})
        assert done["status"] == "succeeded", done
        assert done["placement"][0]["node"] == source and done["attempt"] == 3, (
            done,
            [(e["kind"], e["reason"]) for e in live.audit(job_id=job["id"])],
        )
        assert_bit_identical(adapter(done), reference.weights())
        proto = live.sql("SELECT state, error FROM protocols WHERE job_id = $1", job["id"])
        assert proto[0]["state"] == "rolled_back" and "restarted on the source" in proto[0]["error"]
        kinds = [e["kind"] for e in live.audit(job_id=job["id"])]
        assert "protocol.rollback" in kinds and "protocol.rolled_back" in kinds
    finally:
        live.stack.restart(f"worker-{target}")
    node_ready(live, target)
