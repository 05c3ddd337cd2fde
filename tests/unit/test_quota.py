"""Quota checks (pure)."""

from shared.specs.quota import Quota, TeamUsage, over_quota, priority_allowed


def test_no_quota_admits_everything():
    assert over_quota(None, TeamUsage(100, 100), 8) is None
    assert priority_allowed(None, "high") is None


def test_gpu_and_job_limits_at_the_edge():
    q = Quota(team="vision", max_gpus=8, max_running_jobs=2)
    assert over_quota(q, TeamUsage(gpus=6, running_jobs=1), 2) is None  # exactly at the limit
    assert "quota is 8" in over_quota(q, TeamUsage(gpus=6, running_jobs=1), 3)
    assert "quota is 2" in over_quota(q, TeamUsage(gpus=0, running_jobs=2), 1)


def test_allowed_priorities():
    q = Quota(team="nlp", allowed_priorities=("low",))
    assert priority_allowed(q, "low") is None
    assert "may not submit priority 'high'" in priority_allowed(q, "high")
