"""What the bandit may still do: explore at most `explore_per_hour` times an hour cluster-wide and
`explore_per_job` times per job, and act on one job at most once per `cooldown_s`. Kept by the
policy across passes and config reloads; times are the snapshots' own."""

from __future__ import annotations

from collections import deque

from shared.contracts.strategies import BanditConfig

HOUR_S = 3600.0


class ExplorationBudget:
    def __init__(self) -> None:
        self.explored: deque[float] = deque()  # when each exploring choice was acted on, the last hour's
        self.per_job: dict[str, int] = {}
        self.acted_at: dict[str, float] = {}
        self.spent_total = 0

    def _prune(self, now: float, config: BanditConfig) -> None:
        while self.explored and now - self.explored[0] >= HOUR_S:
            self.explored.popleft()
        if len(self.acted_at) > 4096:
            self.acted_at = {j: t for j, t in self.acted_at.items() if now - t < config.cooldown_s}

    def cooling(self, job_id: str, now: float, config: BanditConfig) -> bool:
        """The bandit acted on this job less than its cooldown ago: it leaves the job to the rules."""
        at = self.acted_at.get(job_id)
        return at is not None and now - at < config.cooldown_s

    def may_explore(self, job_id: str, now: float, config: BanditConfig) -> bool:
        self._prune(now, config)
        return len(self.explored) < config.explore_per_hour and self.per_job.get(job_id, 0) < config.explore_per_job

    def may_explore_window(self, now: float, config: BanditConfig) -> bool:
        """A queue-knob window may explore: the hourly budget has room (no job, so no per-job limit)."""
        self._prune(now, config)
        return len(self.explored) < config.explore_per_hour

    def spend_window(self, now: float) -> None:
        """An exploring queue-knob window acted on."""
        self.explored.append(now)
        self.spent_total += 1

    def spend(self, job_id: str, now: float, explored: bool) -> None:
        """The bandit acted on the job (an exploring choice spends the budget)."""
        self.acted_at[job_id] = now
        if explored:
            self.explored.append(now)
            self.per_job[job_id] = self.per_job.get(job_id, 0) + 1
            self.spent_total += 1

    def give_back(self, job_id: str, ts: float, spent: bool) -> None:
        """An act arbitration refused: its cooldown and what it spent are returned."""
        self.acted_at.pop(job_id, None)
        if spent and ts in self.explored:
            self.explored.remove(ts)
            self.per_job[job_id] -= 1
            self.spent_total -= 1

    def spent_last_hour(self, now: float) -> int:
        return sum(1 for t in self.explored if now - t < HOUR_S)
