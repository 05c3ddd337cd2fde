"""Warm moves whose target is a standby trainer (worker/standby.py), on real training: the move's prepare
is handed to the target worker's standby, and the job ends with weights bit-identical to an uninterrupted
twin's; a standby that dies while preparing leaves the source training, untouched."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import running_stack
from tests.e2e.test_protocols import (
    DONE,
    Reference,
    adapter,
    assert_bit_identical,
    kill_trainer_of,
    spec,
    statuses,
    wait_step,
    wait_stopping,
)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    yield from running_stack(
        tmp_path_factory,
        workers=2,
        cpu_slots=1,
        controller={"timeout": 30},
        worker={"node_timeout": 5, "standby_trainers": 1},
        strategies={"comm_jitter": {"enabled": False}},
    )


@pytest.fixture(scope="module")
def reference(live, tiny_model, data_dir) -> Reference:
    return Reference(live, live.submit(spec(tiny_model, data_dir, "reference"))["id"])


def standbys_ready(live, node: str) -> int:
    try:
        return json.loads((live.stack.home / "data" / "nodes" / node / "standbys.json").read_text())["ready"]
    except (OSError, ValueError, KeyError):
        return 0


def wait_standby(live, node: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not standbys_ready(live, node):
        assert time.monotonic() < deadline, f"no standby trainer ready on {node}"
        time.sleep(0.2)


def test_a_warm_migrate_to_a_standby_is_bit_identical(live, reference, tiny_model, data_dir):
    reference.weights()  # the twin is done first: the standbys of both nodes are free for this job
    job = live.submit(spec(tiny_model, data_dir, "standby-move"))
    running = wait_step(live, job["id"], 25, timeout=300)
    source = running["placement"][0]["node"]
    target = "node-2" if source == "node-1" else "node-1"
    wait_standby(live, target)
    with live.trainer_held(running["id"]):
        r = live.http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})
        assert r.status_code == 202, r.text
        wait_stopping(live, job["id"])
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert done["placement"][0]["node"] == target and done["attempt"] == 2
    assert_bit_identical(adapter(done), reference.weights())
    kinds = [e["kind"] for e in live.audit(job_id=job["id"])]
    assert kinds.index("protocol.prepared") < kinds.index("command.stop") < kinds.index("protocol.resumed")
    [resumed] = live.audit(job_id=job["id"], kind="protocol.resumed")
    assert resumed["data"]["ok"] and resumed["data"]["warm"], resumed
    launched = json.loads((Path(done["job_dir"]) / "attempt-2" / "launch.json").read_text())
    assert launched["warm"] is True and launched.get("standby") is True, launched
    assert "checkpointing" in statuses(live, job["id"])


def test_a_standby_that_dies_while_preparing_leaves_the_source_training(live, reference, tiny_model, data_dir):
    reference.weights()
    job = live.submit(spec(tiny_model, data_dir, "standby-dies"))
    running = wait_step(live, job["id"], 20, timeout=300)
    source = running["placement"][0]["node"]
    target = "node-2" if source == "node-1" else "node-1"
    wait_standby(live, target)
    with live.trainer_held(running["id"]):
        r = live.http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})
        assert r.status_code == 202, r.text
        kill_trainer_of(job["id"], 2)  # the standby, once it is the job's (its environment names the attempt)
        live.wait_audit(lambda t: t, timeout=120, job_id=job["id"], kind="protocol.prepare_failed")
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded" and done["attempt"] == 1 and done["placement"][0]["node"] == source, done
    assert_bit_identical(adapter(done), reference.weights())
    kinds = [e["kind"] for e in live.audit(job_id=job["id"])]
    assert "command.stop" not in kinds and "protocol.rolled_back" in kinds, kinds
    launched = json.loads((Path(done["job_dir"]) / "attempt-2" / "launch.json").read_text())
    assert launched.get("standby") is True, launched  # it was the standby that died
    wait_standby(live, target)  # and the worker launched another
