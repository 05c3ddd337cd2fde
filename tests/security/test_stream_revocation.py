"""Every Server-Sent Events stream stays as authorized as a single request, through the real api on
the real Postgres and NATS: it ends soon after its token is revoked (the api's default recheck,
0.5 s, which is what the stream waits for; nothing else is sent meanwhile but a 15 s keepalive),
and one token holds at most `api.max_streams_per_token` of them (429 beyond)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration.api.conftest import serving_api

STREAMS = ("/v1/nodes/stream", "/v1/jobs/stream", "/v1/audit/stream")
CAP = 2


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    yield from serving_api(tmp_path_factory, {"api": {"max_streams_per_token": CAP}})


def _new_token(api, name: str, role: str = "user", team: str = "alpha") -> tuple[str, str]:
    with api.client("admin") as http:
        r = http.post("/v1/tokens", json={"name": name, "role": role, "team": team})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["secret"]


def _revoke(api, token_id: str) -> None:
    with api.client("admin") as http:
        assert http.post(f"/v1/tokens/{token_id}/revoke").status_code == 200


@pytest.mark.parametrize("path", STREAMS)
def test_a_stream_ends_after_its_token_is_revoked(api, path):
    token_id, secret = _new_token(api, f"watch-{path.split('/')[2]}")
    seen: list[str] = []
    # A read timeout under the 15 s keepalive: a stream that goes on after the revocation fails here.
    with httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {secret}"}, timeout=httpx.Timeout(30, read=10)
    ) as http:
        with http.stream("GET", path) as response:
            assert response.status_code == 200, response.status_code
            lines = response.iter_lines()
            seen.append(next(lines))  # open
            _revoke(api, token_id)
            revoked_at = time.monotonic()
            seen += list(lines)  # ends by itself: the server closes it
            closed_after = time.monotonic() - revoked_at
    assert "event: end" in seen, seen
    assert json.loads(seen[seen.index("event: end") + 1][len("data: ") :]) == {"reason": "token revoked"}
    print(f"{path}: closed {closed_after:.2f} s after the revocation")


@pytest.mark.parametrize("path", STREAMS[:2])
def test_one_token_holds_at_most_its_cap_of_live_streams(api, path):
    _, secret = _new_token(api, f"greedy-{path.split('/')[2]}")
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as http:
        held = [http.stream("GET", path) for _ in range(CAP)]
        responses = [h.__enter__() for h in held]
        try:
            assert [r.status_code for r in responses] == [200] * CAP
            lines = [r.iter_lines() for r in responses]  # kept: a dropped iterator closes its connection
            for it in lines:
                next(it)
            over = http.get(path, timeout=5)
            assert over.status_code == 429, over.text
            assert f"already holds {CAP} open stream(s)" in over.json()["detail"]
            with api.client("other_user") as other:  # another token is not held back
                with other.stream("GET", path) as response:
                    assert response.status_code == 200
        finally:
            for h in held:
                h.__exit__(None, None, None)
