"""What keeps a submission and an audit page cheap, checked where it could silently regress."""

from __future__ import annotations

import gc

from services.api import jobs
from shared.specs.tenant_paths import TenantRoots


def test_a_teams_roots_are_resolved_once_not_per_submission(api, monkeypatch):
    resolved = []
    original = TenantRoots.of.__func__

    def counting(cls, *args, **kwargs):
        resolved.append(args[1])  # the team
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(jobs.TenantRoots, "of", classmethod(counting))
    for i in range(3):
        api.submit("user", name=f"cost-{i}")
    # At most the first submission after start resolves them (the module's earlier tests may have).
    assert len(resolved) <= 1, resolved


def test_startup_objects_are_frozen_out_of_the_collector(api):
    # A full collection walking what startup made stalled requests by 50-90 ms (the submission and
    # audit query p99s); frozen, it is never walked.
    assert gc.get_freeze_count() > 10_000


def test_the_name_lookup_of_a_users_page_has_an_index(api):
    # services/api/redaction.py looks every name-like word of a user's page up among the jobs' names:
    # without an index, a scan of the whole jobs table per page (62 ms at 200,000 jobs).
    indexes = api.server.sql("SELECT indexdef FROM pg_indexes WHERE tablename = 'jobs'")
    assert any(r["indexdef"].endswith("USING btree (name)") for r in indexes), [r["indexdef"] for r in indexes]
