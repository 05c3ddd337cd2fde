"""Streams stay authorized: an open audit tail or log follow ends soon after its token is
revoked (here the recheck is 0.5 s; the default is 30 s, the most allowed), and one token
holds only so many streams at once."""

from __future__ import annotations

import itertools
import json
import threading
import time

import httpx
import pytest

from services.api import streams
from tests.integration.api.conftest import start_api


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    env, server, handle = start_api(tmp_path_factory, {"api": {"stream_recheck_s": 0.5, "max_streams_per_token": 2}})
    try:
        yield handle
    finally:
        server.close()
        env.close()


def _new_token(api, name: str) -> tuple[str, str]:
    with api.client("admin") as http:
        r = http.post("/v1/tokens", json={"name": name, "role": "operator", "team": "sre"})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["secret"]


def _revoke(api, token_id: str) -> None:
    with api.client("admin") as http:
        assert http.post(f"/v1/tokens/{token_id}/revoke").status_code == 200


def test_a_revoked_tokens_audit_tail_is_closed_saying_why(api):
    token_id, secret = _new_token(api, "tail-then-revoked")
    seen: list[str] = []
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as http:
        with http.stream("GET", "/v1/audit/stream") as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            seen.append(next(lines))  # the stream is open
            _revoke(api, token_id)
            revoked_at = time.monotonic()
            for line in lines:  # ends by itself: the server closes it
                seen.append(line)
            closed_after = time.monotonic() - revoked_at
    assert "event: end" in seen and json.loads(seen[seen.index("event: end") + 1][len("data: ") :]) == {
        "reason": "token revoked"
    }
    # The recheck runs on its own clock; well under the 15 s keepalive that is the only traffic here.
    assert closed_after < 10, closed_after


def test_a_revoked_tokens_log_follow_is_closed(api):
    token_id, secret = _new_token(api, "follow-then-revoked")
    job = api.submit("admin", name="never-starts")  # no decider here: it stays pending, so follow waits
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as http:
        with http.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": "true"}) as response:
            assert response.status_code == 200
            timer = threading.Timer(0.2, _revoke, (api, token_id))
            timer.start()
            body = b"".join(response.iter_bytes())
            timer.join()
    assert body.endswith(b"--- stream ended: token revoked ---\n"), body


def test_one_token_holds_at_most_its_share_of_streams(api):
    token_id, secret = _new_token(api, "greedy")
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=api.url, headers=headers, timeout=30) as http:
        first = http.stream("GET", "/v1/audit/stream")
        second = http.stream("GET", "/v1/audit/stream")
        one, two = first.__enter__(), second.__enter__()
        try:
            assert one.status_code == two.status_code == 200
            # Keep the line iterators: one dropped closes its connection, and the server frees the slot.
            lines_one, lines_two = one.iter_lines(), two.iter_lines()
            next(lines_one), next(lines_two)
            third = http.get("/v1/audit/stream", timeout=5)
            assert third.status_code == 429 and "2 open stream(s)" in third.text
            with api.client("operator") as other:  # another token is not held back
                with other.stream("GET", "/v1/audit/stream") as response:
                    assert response.status_code == 200
        finally:
            first.__exit__(None, None, None)
        # A closed stream frees its slot (the server notices the disconnect at its next write or check).
        deadline = time.monotonic() + 10
        while True:
            with http.stream("GET", "/v1/audit/stream") as again:
                if again.status_code == 200 or time.monotonic() > deadline:
                    break
            time.sleep(0.2)
        assert again.status_code == 200
        second.__exit__(None, None, None)


def test_a_quiet_stream_carries_keepalive_comments(api, monkeypatch):
    """Nothing to send: the stream still says something now and then, so a proxy keeps it open and
    a client that went away is found (at 0.2 s here instead of 15 s)."""
    monkeypatch.setattr(streams, "KEEPALIVE_S", 0.2)
    with api.client("operator") as http:
        with http.stream("GET", "/v1/jobs/stream", timeout=30) as response:
            assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
            lines = response.iter_lines()
            assert next(lines) == "retry: 2000"
            comments = [line for line in itertools.islice(lines, 6) if line.startswith(":")]
    assert comments and set(comments) == {": keepalive"}, comments
