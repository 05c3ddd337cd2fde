"""Quotas hold everywhere a job can take devices: at submission (the real api on the real Postgres),
and in the decider's elastic growth and out-of-memory scale-out (the rules over built snapshots:
they are pure functions of the snapshot, so this is what the live decider decides too)."""

from __future__ import annotations

import pytest

from services.decider.rules import elastic_scale
from services.decider.rules.elastic_scale import ElasticSettings
from shared.specs.quota import Quota
from tests.integration.api.conftest import serving_api
from tests.unit.decider.builders import Cluster


def grown(cluster: Cluster) -> dict[str, int]:
    out = elastic_scale.decide(cluster.snapshot(), ElasticSettings())
    return {a.job_id: sum(len(p.gpus) for p in a.placement) for a in out.actions}


def test_elastic_growth_stops_at_the_teams_quota():
    c = Cluster().node("a", 8).job("e", {"a": (0, 1)}, max_gpus=8, team="vision")
    assert grown(c) == {"e": 8}  # no quota: into every idle device
    c.quotas["vision"] = Quota(team="vision", max_gpus=3)
    assert grown(c) == {"e": 3}
    c.quotas["vision"] = Quota(team="vision", max_gpus=2)
    assert grown(c) == {}  # at its quota already: no growth at all


def test_two_jobs_of_a_team_cannot_together_grow_past_its_quota():
    c = (
        Cluster()
        .node("a", 8)
        .job("e1", {"a": (0,)}, max_gpus=4, team="vision", submitted=1)
        .job("e2", {"a": (4,)}, max_gpus=4, team="vision", submitted=2)
    )
    c.quotas["vision"] = Quota(team="vision", max_gpus=4)
    assert grown(c) == {"e1": 3}  # 2 held + 2 granted = 4: nothing left for e2


def test_growth_respects_the_per_user_limit_beside_the_teams():
    c = (
        Cluster()
        .node("a", 8)
        .job("mine", {"a": (0,)}, max_gpus=6, team="vision", owner="ann")
        .job("theirs", {"a": (4,)}, max_gpus=2, team="vision", owner="bob", submitted=1)
    )
    c.quotas["vision"] = Quota(team="vision", max_gpus=8, max_gpus_per_user=3)
    assert grown(c) == {"mine": 3, "theirs": 2}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    yield from serving_api(tmp_path_factory)


def test_submission_bounds_max_gpus_and_per_user_running_jobs_by_the_quota(api):
    with api.client("admin") as admin:
        r = admin.put("/v1/quotas/alpha", json={"max_gpus": 4, "max_running_jobs_per_user": 1, "over_quota": "refuse"})
        assert r.status_code == 200, r.text
    with api.client("user") as http:
        r = http.post("/v1/jobs", json=api.job_spec("greedy", gpus=1, max_gpus=16, multi_node=True))  # may span nodes
        assert r.status_code == 422 and "max_gpus" in r.text and "(4)" in r.text, r.text
        assert http.post("/v1/jobs", json=api.job_spec("first", gpus=1, max_gpus=4)).status_code == 201
        second = http.post("/v1/jobs", json=api.job_spec("second", gpus=1))
        assert second.status_code == 429 and "per user" in second.text, second.text


def test_admission_counts_the_devices_a_grown_job_holds(api):
    with api.client("admin") as admin:
        assert admin.put("/v1/quotas/beta", json={"max_gpus": 4, "over_quota": "refuse"}).status_code == 200
    with api.client("other_user") as http:
        job = http.post("/v1/jobs", json=api.job_spec("elastic", gpus=1, max_gpus=3)).json()["id"]
        # It grew to 3 devices (the executor's record of a scale: placement, status running).
        api.server.env.sql(
            "UPDATE jobs SET status = 'running', started_at = now(), attempt = 1, job_dir = '/x',"
            ' placement = \'[{"node": "a", "gpus": [0, 1, 2]}]\' WHERE id = $1',
            job,
        )
        more = http.post("/v1/jobs", json=api.job_spec("two-more", gpus=2))
        assert more.status_code == 429 and "would use 5 device(s)" in more.text, more.text
