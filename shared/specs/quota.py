"""Team quotas: whether a job may be admitted now, and why not. Pure; used by the api
(refuse at submission) and the decider (hold in the queue)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Quota:
    team: str
    max_gpus: int | None = None
    max_running_jobs: int | None = None
    allowed_priorities: tuple[str, ...] | None = None
    over_quota: Literal["queue", "refuse"] = "queue"
    max_gpus_per_user: int | None = None  # one user (a token name) of the team, at once
    max_running_jobs_per_user: int | None = None

    @classmethod
    def from_row(cls, row) -> Quota:
        allowed = row["allowed_priorities"]
        return cls(
            team=row["team"],
            max_gpus=row["max_gpus"],
            max_running_jobs=row["max_running_jobs"],
            allowed_priorities=tuple(allowed) if allowed is not None else None,
            over_quota=row["over_quota"],
            max_gpus_per_user=row.get("max_gpus_per_user"),
            max_running_jobs_per_user=row.get("max_running_jobs_per_user"),
        )


@dataclass(frozen=True)
class TeamUsage:
    gpus: int = 0
    running_jobs: int = 0

    def __add__(self, more_gpus: int) -> TeamUsage:
        """The same jobs holding `more_gpus` more devices (a job that grew)."""
        return TeamUsage(gpus=self.gpus + more_gpus, running_jobs=self.running_jobs)


def priority_allowed(quota: Quota | None, priority: str) -> str | None:
    """Why this priority is not allowed for the team, or None."""
    if quota is None or quota.allowed_priorities is None or priority in quota.allowed_priorities:
        return None
    return f"team {quota.team} may not submit priority {priority!r} (allowed: {list(quota.allowed_priorities)})"


def over_quota(
    quota: Quota | None, usage: TeamUsage, gpus: int, user: str | None = None, user_usage: TeamUsage | None = None
) -> str | None:
    """Why admitting a job of `gpus` devices would exceed the team's quota (or, with `user_usage`, the
    per-user limits of its submitter), or None."""
    if quota is None:
        return None
    if quota.max_gpus is not None and usage.gpus + gpus > quota.max_gpus:
        return (
            f"team {quota.team} would use {usage.gpus + gpus} device(s); its quota is {quota.max_gpus} "
            f"({usage.gpus} in use)"
        )
    if quota.max_running_jobs is not None and usage.running_jobs + 1 > quota.max_running_jobs:
        return f"team {quota.team} already runs {usage.running_jobs} job(s); its quota is {quota.max_running_jobs}"
    if user_usage is None:
        return None
    if quota.max_gpus_per_user is not None and user_usage.gpus + gpus > quota.max_gpus_per_user:
        return (
            f"user {user} would use {user_usage.gpus + gpus} device(s); team {quota.team} allows "
            f"{quota.max_gpus_per_user} per user ({user_usage.gpus} in use)"
        )
    if quota.max_running_jobs_per_user is not None and user_usage.running_jobs + 1 > quota.max_running_jobs_per_user:
        return (
            f"user {user} already runs {user_usage.running_jobs} job(s); team {quota.team} allows "
            f"{quota.max_running_jobs_per_user} per user"
        )
    return None


def gpu_headroom(quota: Quota | None, usage: TeamUsage, user_usage: TeamUsage | None = None) -> int | None:
    """How many more devices the team (and the user) may take now; None: no limit. Elastic growth and
    scale-out stay within it."""
    if quota is None:
        return None
    room = [quota.max_gpus - usage.gpus] if quota.max_gpus is not None else []
    if user_usage is not None and quota.max_gpus_per_user is not None:
        room.append(quota.max_gpus_per_user - user_usage.gpus)
    return max(0, min(room)) if room else None
