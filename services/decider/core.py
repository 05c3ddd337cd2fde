"""The decider's core: one evaluation pass without I/O: run every enabled rule over a snapshot,
arbitrate, and say what to publish. `DecisionPass` reads and publishes around it; the simulator
and tests drive it directly.

Per rule: its typed config (from the config in force, schedules applied), its period (a rule
may ask to run only every N seconds), its budget and isolation (rule_runner), shadow mode
and cooldown (carried into arbitration). Learned state (cooldowns, the rate limiter, when
each rule last ran, in-flight expectations) lives here, keyed by rule name, so it survives
hot reloads of rules and config.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.decider.arbitration import Cooldowns, InFlight, Proposal, RateLimiter, Verdict, arbitrate
from services.decider.plugin import Rule
from services.decider.rule_runner import InlineRunner, RuleRunner, RunResult
from services.decider.snapshot import Snapshot
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import JobStatus
from shared.contracts.messages import Decision
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.infra.config import AdcConfig, RuleControls

log = logging.getLogger(__name__)
DONE_STATES = {"done", "refused", "failed"}
MOVES = {"migrate", "scale"}  # the decisions whose target may fail after the source stopped


@dataclass(frozen=True)
class Incident:
    """Something about a rule itself worth auditing: it raised, overran, or could not be configured."""

    kind: str  # rule.error | rule.overrun | rule.config_error, each also a ReasonCode
    rule: str
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class PassResult:
    snapshot_ts: float
    decisions: list[Decision] = field(default_factory=list)
    shadow: list[Decision] = field(default_factory=list)
    refused: list[Verdict] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    pending: dict[str, dict[str, str]] = field(default_factory=dict)  # job -> rule -> reason
    timings_ms: dict[str, float] = field(default_factory=dict)
    bandit: list[Any] = field(default_factory=list)  # the bandit's audit events (bandit.decision, bandit.reward)

    def pending_reason(self, job_id: str) -> str:
        return "; ".join(f"{reason} [{rule}]" for rule, reason in self.pending.get(job_id, {}).items())


class EngineCore:
    def __init__(
        self,
        decision_timeout_s: float = 90.0,
        max_disruptions_per_minute: int = 10,
        runner: RuleRunner | InlineRunner | None = None,
    ) -> None:
        self.runner = runner or RuleRunner()
        self.cooldowns = Cooldowns()
        self.limiter = RateLimiter(max_disruptions_per_minute)
        self.in_flight: dict[str, InFlight] = {}
        self.last_run: dict[str, float] = {}
        self.decision_timeout_s = decision_timeout_s
        # Each rule's typed config, kept while the rule and the config in force are the same objects
        # (a reload or a schedule brings new ones): validating it again every pass changes nothing.
        self._typed: dict[str, tuple[Rule, AdcConfig, Any]] = {}
        # The learned policy (services/decider/bandit), attached when `bandit.mode` is not off: it
        # chooses among the rules' feasible placements before arbitration, which judges it as any rule.
        self.bandit: Any = None

    # --- expectations ----------------------------------------------------------------

    def booked(self) -> list[NodeGpus]:
        """Devices promised by decisions in flight: not free for anyone else yet."""
        return [part for flight in self.in_flight.values() for part in flight.booked]

    def resolve(self, jobs: Mapping[str, Any], decision_states: Mapping[str, str], now: float) -> list[tuple[str, str]]:
        """Drop expectations that are settled; return (job, why) for each dropped.

        `jobs` maps live job ids to their status; `decision_states` the executor's state of
        each decision it recorded."""
        settled = []
        for job_id, flight in list(self.in_flight.items()):
            state = decision_states.get(flight.decision_id)
            status = jobs.get(job_id)
            if state in DONE_STATES:
                why = f"executor: {state}"
            elif status is None:
                why = "job finished"
            elif flight.kind == "start" and status != JobStatus.PENDING:
                why = f"job is {status}"
            elif now - flight.issued_at > self.decision_timeout_s:
                why = f"no outcome within {self.decision_timeout_s:.0f} s"
            else:
                continue
            del self.in_flight[job_id]
            settled.append((job_id, why))
        return settled

    # --- a pass ----------------------------------------------------------------------

    async def evaluate(self, snapshot: Snapshot, rules: Mapping[str, Rule], config: AdcConfig) -> PassResult:
        now = snapshot.ts
        result = PassResult(snapshot_ts=now)
        if self.bandit is not None:  # queue knobs (decision point 3): the window's setting, read by the rules
            config = self.bandit.knobs.overlay(config, snapshot)
        proposals: list[Proposal] = []
        due: list[tuple[str, Rule, RuleControls]] = []
        for name, rule in sorted(rules.items(), key=lambda kv: (kv[1].precedence, kv[0])):
            kept = self._typed.get(name)
            if kept is not None and kept[0] is rule and kept[1] is config:
                typed = kept[2]
            else:
                try:
                    typed = rule.configure(config)  # the typed config carries the engine's controls too
                except Exception as err:  # noqa: BLE001 - validated on load; a schedule may still break it
                    self._typed.pop(name, None)
                    result.incidents.append(
                        Incident("rule.config_error", name, f"rule {name} has no valid config: {err}")
                    )
                    continue
                self._typed[name] = (rule, config, typed)
            if not typed.enabled:
                continue
            period = rule.period(typed) if rule.period else None
            if period and now - self.last_run.get(name, float("-inf")) < period:
                continue
            busy = self.runner.busy_since(name)
            if busy is not None:
                log.info("rule %s skipped: its previous evaluation is still running", name)
                continue
            self.last_run[name] = now
            due.append((name, rule, typed))
        # Rules see which jobs each of them is cooling down on, so one choosing among jobs (victims,
        # say) passes over those arbitration would refuse it, instead of proposing them again.
        snapshot.set_cooling(self.cooldowns.by_rule(now))
        runs = await self.runner.run_all([(rule, snapshot, typed, typed.budget_ms / 1000.0) for _, rule, typed in due])
        for (name, rule, controls), run in zip(due, runs):
            result.timings_ms[name] = round(run.wall_ms, 3)
            if not run.ok:
                result.incidents.append(_incident(run, controls))
                continue
            for job_id, reason in run.output.pending.items():
                result.pending.setdefault(job_id, {})[name] = reason
            precedence = controls.precedence if controls.precedence is not None else rule.precedence
            proposals += [
                Proposal(name, _coded(action), precedence, controls.shadow, controls.cooldown_s)
                for action in run.output.actions
            ]
        self.cooldowns.prune(now)
        # A move's fallback when its target fails is the deciding rule's policy; the decision carries it.
        fallback = {name: controls.on_target_failure for name, _, controls in due}
        if self.bandit is not None:
            proposals = self.bandit.choose(proposals, snapshot, {name: controls for name, _, controls in due})
        for verdict in arbitrate(proposals, snapshot, self.in_flight, self.cooldowns, self.limiter, now):
            p = verdict.proposal
            if not verdict.accepted:
                result.refused.append(verdict)
                if p.kind == "start":
                    result.pending.setdefault(p.action.job_id, {})[p.rule] = Reason(
                        ReasonCode.PENDING_START_HELD, f"start held back: {verdict.why}"
                    )
                continue
            decision = Decision(
                decision_id=uuid.uuid4().hex,
                ts=now,
                rule=p.rule,
                action=p.action,
                snapshot_ts=snapshot.ts,
                shadow=p.shadow,
                on_target_failure=fallback.get(p.rule) if p.kind in MOVES else None,
            )
            if p.shadow:
                result.shadow.append(decision)
                continue
            result.decisions.append(decision)
            self.in_flight[p.action.job_id] = InFlight(
                decision.decision_id, p.rule, p.kind, now, tuple(getattr(p.action, "placement", ()) or ())
            )
            if p.kind == "start":
                result.pending.setdefault(p.action.job_id, {})[p.rule] = Reason(
                    ReasonCode.PENDING_START_DECIDED, "start decided; the executor is placing it"
                )
        if self.bandit is not None:
            result.bandit = self.bandit.settle(result.decisions, snapshot)
        return result


def _coded(action: Any) -> Any:
    """A plugin rule's action that names no reason code gets `uncoded`: every decision has one."""
    if getattr(action, "reason_code", ReasonCode.UNCODED) is None:
        return action.model_copy(update={"reason_code": ReasonCode.UNCODED})
    return action


def _incident(run: RunResult, controls: RuleControls) -> Incident:
    if run.overrun:
        return Incident(
            "rule.overrun",
            run.rule,
            f"rule {run.rule} took longer than its budget of {controls.budget_ms:g} ms; its answer is "
            f"discarded and it is not run again until the call ends",
            {"budget_ms": controls.budget_ms, "waited_ms": round(run.wall_ms, 1)},
        )
    return Incident("rule.error", run.rule, f"rule {run.rule} raised {run.error}", {"error": run.error})
