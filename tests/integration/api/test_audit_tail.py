"""An SRE's `adc audit tail -f`: each decision shows up as it is made, and after a disconnect (the
api restarting) the tail resumes where it was, with no gap and no duplicate."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import uuid

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.api.conftest import decision
from tests.waits import until


class Tail:
    """`adc audit tail -f -o json` as a process; each stdout line is kept, parsed, in arrival order."""

    def __init__(self, api, *argv: str, token: str = "operator") -> None:
        env = os.environ | {
            "ADC_API_URL": api.url,
            "ADC_TOKEN": api.tokens.for_role(token),
            "ADC_HOME": "/nonexistent",
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "audit", "tail", "-f", "-o", "json", *argv],
            env=env,
            cwd=str(REPO_ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next(self, timeout: float = 10) -> dict:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nothing from the tail within {timeout}s; stderr: {''.join(self.stderr)}") from None

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _wait_connected(tail: Tail, timeout: float = 15) -> None:
    """The tail says where it follows from once the stream is open."""

    def connected() -> bool:
        assert tail.proc.poll() is None, f"tail exited: {''.join(tail.stderr)}"
        return "following the audit log" in "".join(tail.stderr)

    until(connected, lambda: f"the tail connected; its stderr: {''.join(tail.stderr)}", timeout, poll=0.05)


@pytest.fixture
def tail(api):
    opened: list[Tail] = []

    def open_tail(*argv: str, token: str = "operator") -> Tail:
        opened.append(Tail(api, *argv, token=token))
        return opened[-1]

    yield open_tail
    for t in opened:
        t.close()


def test_an_sre_sees_each_decision_as_it_is_made(api, tail):
    """Each decision reaches the tail before the next one is made: the tail follows live, not by
    polling the table after the fact (how fast it does is a figure for bench/, not a test)."""
    sre = tail("--kind", "decision", "--lines", "0")
    _wait_connected(sre)
    run = uuid.uuid4().hex[:8]
    for i in range(5):
        event = decision(run, i)
        api.server.publish_audit(event)
        row = sre.next()
        assert row["event_id"] == event.event_id and row["rule"] == "oom_protection"


def test_the_tail_resumes_after_the_api_restarts_with_no_gap_and_no_duplicate(api, tail):
    run = uuid.uuid4().hex[:8]
    sre = tail("--kind", "decision", "--lines", "0")
    _wait_connected(sre)
    seen: list[str] = []
    for i in range(5):
        api.server.publish_audit(decision(run, i))
    seen += [sre.next()["event_id"] for _ in range(5)]

    api.server.stop_api()  # the tail's connection drops; decisions keep being made meanwhile
    for i in range(5, 10):
        api.server.publish_audit(decision(run, i))
    until(
        lambda: (
            api.server.sql("SELECT count(*) AS n FROM audit_events WHERE event_id LIKE $1", f"{run}-%")[0]["n"] >= 10
        ),
        "the sink wrote the ten decisions made before the api came back",
        timeout=30,
        poll=0.05,
    )
    api.server.start_api()
    for i in range(10, 15):
        api.server.publish_audit(decision(run, i))

    seen += [sre.next(timeout=20)["event_id"] for _ in range(10)]
    assert seen == [f"{run}-{i}:decided" for i in range(15)]
    # A duplicate would come before anything published after it: the next line is this one.
    api.server.publish_audit(decision(run, 15))
    assert sre.next(timeout=20)["event_id"] == f"{run}-15:decided", "a duplicate arrived"
    assert "reconnect" in "".join(sre.stderr)


def test_the_stream_honours_last_event_id_filters_and_teams(api):
    run = uuid.uuid4().hex[:8]
    for i in range(3):
        api.server.publish_audit(decision(run, i))
    rows = api.wait_audit(lambda e: e["event_id"] == f"{run}-2:decided")
    ids = {e["event_id"]: e["id"] for e in rows}
    after = ids[f"{run}-0:decided"]
    with api.client("admin") as http:
        with http.stream(
            "GET", "/v1/audit/stream", params={"kind": "decision"}, headers={"Last-Event-ID": str(after)}
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            got = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(json.loads(line[6:])["event_id"])
                if len(got) == 2:
                    break
    assert got == [f"{run}-1:decided", f"{run}-2:decided"]
    # A user's tail carries only their team's jobs' events: these decisions name no alpha job.
    with api.client("user") as http:
        with http.stream("GET", "/v1/audit/stream", params={"after_id": after - 1}) as r:
            first = []
            for line in r.iter_lines():
                if line.startswith(("data: ", "id: ")):
                    first.append(line)
                    break
    assert first == [f"id: {after - 1}"]  # the starting cursor, then nothing of another team
    with api.client("admin") as http:
        bad = http.get("/v1/audit/stream", headers={"Last-Event-ID": "not-a-number"})
        assert bad.status_code == 422 and "last-event-id" in bad.text.lower()
