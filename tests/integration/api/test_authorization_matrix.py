"""Every endpoint × every caller: no token, a malformed header, an unknown, an expired and a
revoked token, and each role. The routes come from the app itself, so an endpoint added later
is covered, and one with no rule below fails until someone decides who may call it."""

from __future__ import annotations

import re

import pytest

from services.api.app import create_app
from shared.infra.config import parse_config

PUBLIC = "public"
ANYONE = frozenset({"user", "operator", "admin"})
OPERATORS = frozenset({"operator", "admin"})
ADMIN = frozenset({"admin"})

# (method, path with {} for each parameter) -> who may call it. "own team": a user reaches only
# their own team's jobs; another team's job is 404 to them, as if it did not exist.
ACCESS: dict[tuple[str, str], tuple[object, bool]] = {
    ("GET", "/healthz"): (PUBLIC, False),
    ("GET", "/readyz"): (PUBLIC, False),
    ("GET", "/metrics"): (PUBLIC, False),
    ("GET", "/openapi.json"): (PUBLIC, False),
    ("GET", "/docs"): (PUBLIC, False),
    ("GET", "/docs/oauth2-redirect"): (PUBLIC, False),
    ("GET", "/redoc"): (PUBLIC, False),
    ("POST", "/v1/jobs"): (ANYONE, False),
    ("POST", "/v1/jobs/chain"): (ANYONE, False),
    ("GET", "/v1/jobs"): (ANYONE, False),
    ("GET", "/v1/jobs/{}"): (ANYONE, True),
    ("POST", "/v1/jobs/{}/cancel"): (ANYONE, True),
    ("POST", "/v1/jobs/{}/export"): (ANYONE, True),
    ("POST", "/v1/jobs/{}/chat/completions"): (ANYONE, True),
    ("GET", "/v1/jobs/{}/logs"): (ANYONE, True),
    ("GET", "/v1/jobs/{}/metrics"): (ANYONE, True),
    ("GET", "/v1/jobs/{}/events"): (ANYONE, True),
    ("POST", "/v1/jobs/{}/pause"): (ANYONE, True),
    ("POST", "/v1/jobs/{}/resume"): (ANYONE, True),
    ("POST", "/v1/jobs/{}/migrate"): (OPERATORS, False),
    ("GET", "/v1/nodes"): (ANYONE, False),
    ("POST", "/v1/nodes/{}/cordon"): (OPERATORS, False),
    ("POST", "/v1/nodes/{}/uncordon"): (OPERATORS, False),
    ("POST", "/v1/nodes/{}/drain"): (OPERATORS, False),
    ("GET", "/v1/audit"): (ANYONE, False),
    ("GET", "/v1/audit/stream"): (ANYONE, False),
    ("GET", "/v1/audit/verify"): (ADMIN, False),
    ("GET", "/v1/policies"): (OPERATORS, False),
    ("GET", "/v1/policies/history"): (OPERATORS, False),
    ("PUT", "/v1/policies"): (ADMIN, False),
    ("POST", "/v1/policies/reload"): (ADMIN, False),
    ("GET", "/v1/quotas"): (ANYONE, False),
    ("PUT", "/v1/quotas/{}"): (ADMIN, False),
    ("DELETE", "/v1/quotas/{}"): (ADMIN, False),
    ("GET", "/v1/me"): (ANYONE, False),
    ("GET", "/v1/tokens"): (ADMIN, False),
    ("POST", "/v1/tokens"): (ADMIN, False),
    ("POST", "/v1/tokens/{}/revoke"): (ADMIN, False),
    ("GET", "/v1/controller"): (ANYONE, False),
    ("POST", "/v1/controller/pause"): (OPERATORS, False),
    ("POST", "/v1/controller/resume"): (OPERATORS, False),
    ("GET", "/v1/bandit"): (OPERATORS, False),
    ("GET", "/v1/bandit/log"): (OPERATORS, False),
    ("POST", "/v1/bandit/reset"): (ADMIN, False),
    # The dashboard: the page is static; sign-in checks the header's token, sign-out only clears a cookie.
    ("GET", "/ui"): (PUBLIC, False),
    ("POST", "/ui/session"): (ANYONE, False),
    ("POST", "/ui/logout"): (PUBLIC, False),
    ("GET", "/v1/nodes/stream"): (ANYONE, False),
    ("GET", "/v1/jobs/stream"): (ANYONE, False),
    ("GET", "/v1/metrics"): (OPERATORS, False),
    # The dashboard's queue, checkpoints and telemetry history: a user's queue lists only their team's jobs.
    ("GET", "/v1/queue"): (ANYONE, False),
    ("GET", "/v1/jobs/{}/checkpoints"): (ANYONE, True),
    ("GET", "/v1/nodes/{}/history"): (ANYONE, False),
    ("GET", "/v1/cluster/history"): (ANYONE, False),
}

UNAUTHENTICATED = {
    "anonymous": None,
    "malformed": "Basic YWRtaW46YWRtaW4=",
    "unknown": "Bearer adc_not-a-real-token",
    "expired": "expired",
    "revoked": "revoked",
}


def _routes() -> list[tuple[str, str, str]]:
    """(method, shape, concrete path template) of every route the app serves."""
    app = create_app(parse_config({}, env={}))
    try:  # FastAPI >= 0.16x includes routers lazily; this walks what is actually served
        from fastapi.routing import iter_route_contexts

        routes = list(iter_route_contexts(app.routes))
    except ImportError:
        routes = app.routes
    found = []
    for route in routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                found.append((method, re.sub(r"\{[^}]+\}", "{}", route.path), route.path))
    return found


ROUTES = _routes()


@pytest.fixture(scope="module")
def world(api):
    """Something for each path parameter: a team alpha job, a node, a team, a spare token."""
    job = api.submit("user", name="matrix-job")
    api.server.sql("INSERT INTO nodes (id, devices) VALUES ('node-m', '[]'::jsonb)")
    with api.client("admin") as http:
        spare = http.post("/v1/tokens", json={"name": "spare", "role": "user", "team": "alpha"}).json()
    with api.client(None) as http:
        yield {
            "job_id": job["id"],
            "node": "node-m",
            "node_id": "node-m",
            "team": "alpha",
            "token_id": spare["id"],
            "http": http,
        }


def _call(world, method: str, template: str, authorization: str | None) -> int:
    path = re.sub(r"\{([^}]+)\}", lambda m: world[m.group(1)], template)
    headers = {"Authorization": authorization} if authorization else {}
    body = {} if method in ("POST", "PUT") else None
    with world["http"].stream(method, path, json=body, headers=headers) as response:
        return response.status_code  # streams (the audit tail) are not read, only answered


def _header(api, caller: str) -> str | None:
    if caller in ("expired", "revoked"):
        return f"Bearer {api.tokens.for_role(caller)}"
    if caller in UNAUTHENTICATED:
        return UNAUTHENTICATED[caller]
    return f"Bearer {api.tokens.for_role(caller)}"


def test_every_route_has_a_rule():
    missing = sorted({(m, shape) for m, shape, _ in ROUTES} - set(ACCESS))
    assert not missing, f"routes with no rule in ACCESS; decide who may call them: {missing}"


@pytest.mark.parametrize("method,shape,template", ROUTES, ids=[f"{m} {t}" for m, _, t in ROUTES])
def test_route_admits_exactly_its_callers(api, world, method, shape, template):
    assert (method, shape) in ACCESS, f"no rule for {method} {template}; add it to ACCESS"
    allowed, _ = ACCESS[(method, shape)]
    answers = {}
    for caller in [*UNAUTHENTICATED, "user", "operator", "admin"]:
        answers[caller] = _call(world, method, template, _header(api, caller))
    wrong = {}
    for caller, status in answers.items():
        if allowed == PUBLIC:
            ok = status < 400
        elif caller in UNAUTHENTICATED:
            ok = status == 401
        elif caller in allowed:
            ok = status not in (401, 403) and status < 500
        else:
            ok = status == 403
        if not ok:
            wrong[caller] = status
    assert not wrong, f"{method} {template}: unexpected answers {wrong} (all: {answers})"


TEAM_SCOPED = [(m, s, t) for m, s, t in ROUTES if ACCESS.get((m, s), (None, False))[1]]


@pytest.mark.parametrize("method,shape,template", TEAM_SCOPED, ids=[f"{m} {t}" for m, _, t in TEAM_SCOPED])
def test_another_teams_job_does_not_exist_for_a_user(api, world, method, shape, template):
    assert _call(world, method, template, f"Bearer {api.tokens.other_user}") == 404


def test_a_user_sees_only_their_own_teams_jobs_and_audit(api, world):
    with api.client("other_user") as http:
        assert world["job_id"] not in [j["id"] for j in http.get("/v1/jobs").json()["items"]]
        assert http.get("/v1/jobs", params={"team": "alpha"}).status_code == 403
        assert http.get("/v1/audit", params={"job_id": world["job_id"]}).json()["items"] == []
    with api.client("user") as http:
        assert world["job_id"] in [j["id"] for j in http.get("/v1/jobs").json()["items"]]
    api.wait_audit(lambda e: e["job_id"] == world["job_id"])
    with api.client("user") as http:
        assert http.get("/v1/audit", params={"job_id": world["job_id"]}).json()["items"]
