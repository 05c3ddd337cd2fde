"""Reason codes: every action a rule builds names one from the closed enum, and every decision,
pending reason and refusal of a pass carries one beside its sentence."""

from __future__ import annotations

import ast
import asyncio
import pickle
from pathlib import Path

import pytest

from services.decider.arbitration import Cooldowns, InFlight, Proposal, RateLimiter, arbitrate
from services.decider.core import EngineCore, PassResult
from services.decider.plugin import Rule, RuleOutput
from services.decider.rule_runner import InlineRunner
from shared.contracts.actions import JOB_ACTIONS, Cordon, Drain, Migrate, NodeGpus, Preempt, Start, Uncordon
from shared.contracts.job_status import JobStatus
from shared.contracts.reason_codes import Reason, ReasonCode, code_of
from shared.infra.config import load_config, parse_config
from shared.infra.pending_reasons import PendingReason
from sim.cluster import Topology
from sim.policies import policy_config
from sim.simulator import SimOptions, Simulation
from sim.traces import read_trace, window
from sim.workload import Enrichment, enrich
from tests.unit.decider.builders import Cluster

REPO = Path(__file__).resolve().parents[3]
DECIDER = REPO / "services" / "decider"
ACTIONS = {cls.__name__ for cls in (*JOB_ACTIONS, Cordon, Uncordon, Drain)}
TRACE = REPO.parent / "shared" / "traces" / "pollux_osdi21" / "workload-6.csv"


def uncoded_actions(source: str, name: str) -> list[str]:
    """Each action built in `source` without `reason_code=ReasonCode.<a member>`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACTIONS):
            continue
        code = next((k.value for k in node.keywords if k.arg == "reason_code"), None)
        ok = (
            isinstance(code, ast.Attribute)
            and isinstance(code.value, ast.Name)
            and code.value.id == "ReasonCode"
            and code.attr in ReasonCode.__members__
        )
        if not ok:
            found.append(f"{name}:{node.lineno}: {node.func.id}(...) names no ReasonCode")
    return found


def _decider_modules() -> list[Path]:
    return sorted(p for p in DECIDER.rglob("*.py"))


@pytest.mark.parametrize("path", _decider_modules(), ids=lambda p: str(p.relative_to(DECIDER)))
def test_every_action_the_decider_builds_names_a_code_from_the_enum(path):
    assert uncoded_actions(path.read_text(), path.name) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "Migrate(job_id='j', placement=[], reason='hot')",  # no code at all
        "Preempt(job_id='j', reason='r', reason_code='oom.preempt')",  # a bare string, not the enum
        "Cordon(node='n', reason='r', reason_code=ReasonCode.NO_SUCH_CODE)",  # not a member
    ],
)
def test_the_code_check_finds_an_action_without_one(snippet):
    assert len(uncoded_actions(snippet, "rule.py")) == 1
    assert uncoded_actions("Start(job_id='j', placement=[], reason='r', reason_code=ReasonCode.ADMIT)", "r") == []


def test_codes_are_closed_unique_and_a_reason_is_its_sentence():
    values = [c.value for c in ReasonCode]
    assert len(values) == len(set(values))
    with pytest.raises(ValueError):
        ReasonCode("made.up")
    r = Reason(ReasonCode.PENDING_AFTER, "waits for job j1")
    assert r == "waits for job j1" and repr(r) == repr("waits for job j1") and f"{r}" == "waits for job j1"
    assert r.code is ReasonCode.PENDING_AFTER and code_of(r) is ReasonCode.PENDING_AFTER
    assert pickle.loads(pickle.dumps(r)).code is ReasonCode.PENDING_AFTER
    assert code_of("plain words") is ReasonCode.UNCODED
    action = Start(job_id="j", placement=[], reason="r", reason_code=ReasonCode.ADMIT)
    assert Start.model_validate_json(action.model_dump_json()).reason_code is ReasonCode.ADMIT
    assert '"reason_code":"admit"' in action.model_dump_json()


def test_arbitration_gives_each_refusal_its_code():
    snap = (
        Cluster()
        .node("a", 2)
        .node("b", 2)
        .job("hot", {"a": (0,)})
        .job("moving", {"a": (1,)}, status=JobStatus.MIGRATING)
        .pending("new", gpus=1)
        .snapshot()
    )
    cooldowns = Cooldowns()
    cooldowns.start("load_balance", "hot", snap.ts - 1, 60)

    def mig(job, gpu):
        return Migrate(job_id=job, placement=[NodeGpus(node="b", gpus=(gpu,))], reason="t")

    verdicts = arbitrate(
        [
            Proposal("oom_protection", mig("hot", 0), precedence=10),
            Proposal("priority_fifo", Start(job_id="new", placement=[NodeGpus(node="b", gpus=(0,))], reason="t"), 20),
            Proposal("load_balance", mig("hot", 1), precedence=70),
            Proposal("load_balance", mig("moving", 1), precedence=70),
            Proposal("drain", Preempt(job_id="gone", reason="t"), precedence=5),
            Proposal("drain", Preempt(job_id="flying", reason="t"), precedence=5),
        ],
        snap,
        {"flying": InFlight("d1", "oom_protection", "migrate", snap.ts - 1)},
        cooldowns,
        RateLimiter(10),
        snap.ts,
    )
    codes = {(v.proposal.rule, v.proposal.action.job_id): v.code for v in verdicts}
    assert codes == {
        ("oom_protection", "hot"): None,
        ("priority_fifo", "new"): ReasonCode.REFUSED_DEVICE_TAKEN,
        ("load_balance", "hot"): ReasonCode.REFUSED_TAKEN_THIS_PASS,
        ("load_balance", "moving"): ReasonCode.REFUSED_NOT_RUNNING,
        ("drain", "gone"): ReasonCode.REFUSED_NO_LIVE_JOB,
        ("drain", "flying"): ReasonCode.REFUSED_IN_FLIGHT,
    }


def _evaluate(snapshot, rules) -> PassResult:
    core = EngineCore(runner=InlineRunner())
    return asyncio.run(core.evaluate(snapshot, rules, load_config()))


def test_a_pass_codes_its_decisions_and_pending_reasons_and_a_plugin_gets_uncoded():
    snap = Cluster().node("a", 2).job("run", {"a": (0,)}).pending("fits", gpus=1).pending("big", gpus=4).snapshot()

    def plugin(snapshot, config):  # a third-party rule that knows nothing of codes
        return RuleOutput([Migrate(job_id="run", placement=[NodeGpus(node="a", gpus=(0,))], reason="x")], {})

    from services.decider.rules.priority_fifo import RULE as fifo

    result = _evaluate(snap, {"priority_fifo": fifo, "my_rule": Rule(name="my_rule", decide=plugin)})
    codes = {d.action.job_id: d.action.reason_code for d in result.decisions}
    assert codes == {"fits": ReasonCode.ADMIT, "run": ReasonCode.UNCODED}
    assert code_of(result.pending["fits"]["priority_fifo"]) is ReasonCode.PENDING_START_DECIDED
    assert code_of(result.pending["big"]["priority_fifo"]) is ReasonCode.PENDING_NEVER_FITS


def test_the_bucket_entry_carries_the_first_rule_s_code():
    entry = PendingReason(
        job_id="j",
        reason="x",
        reason_code=ReasonCode.PENDING_NO_FREE_DEVICES,
        rules={"priority_fifo": "x"},
        rule_codes={"priority_fifo": ReasonCode.PENDING_NO_FREE_DEVICES},
        since=0.0,
        evaluated_at=0.0,
    )
    again = PendingReason.model_validate_json(entry.model_dump_json())
    assert again.reason_code is ReasonCode.PENDING_NO_FREE_DEVICES
    assert PendingReason(job_id="j", reason="x", rules={}, since=0, evaluated_at=0).reason_code is ReasonCode.UNCODED


class _Recording(Simulation):
    """A simulation that keeps every pass's result (the digest's hook sees each one)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[PassResult] = []

    def _fingerprint(self, now: float, result) -> None:
        super()._fingerprint(now, result)
        self.results.append(result)


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
def test_every_decision_pending_reason_and_refusal_of_a_simulated_run_has_a_code():
    """The live rules on a real trace (Pollux workload-6, 64 GPUs): nothing reaches the audit uncoded."""
    enrichment = Enrichment(seed=0)
    specs = enrich(window(read_trace(str(TRACE), 0), 0.0, None), 8, enrichment)
    config = policy_config(load_config(), "adc")
    sim = _Recording(specs, Topology(64, 8), config, "adc", SimOptions(digest=True, enrichment=enrichment))
    sim.run()
    decisions = [d for r in sim.results for d in r.decisions + r.shadow]
    pending = [reason for r in sim.results for by_rule in r.pending.values() for reason in by_rule.values()]
    refused = [v for r in sim.results for v in r.refused]
    assert decisions and pending and refused
    assert {type(d.action.reason_code) for d in decisions} == {ReasonCode}
    assert ReasonCode.UNCODED not in {d.action.reason_code for d in decisions}
    assert all(isinstance(p, Reason) and p.code is not ReasonCode.UNCODED for p in pending)
    assert all(isinstance(v.code, ReasonCode) and v.code is not ReasonCode.UNCODED for v in refused)
    seen = {d.action.reason_code for d in decisions}
    assert {ReasonCode.ADMIT, ReasonCode.PRIORITY_PREEMPT, ReasonCode.OOM_MIGRATE, ReasonCode.ELASTIC_GROW} <= seen, (
        seen
    )


def test_a_move_decision_carries_its_rules_on_target_failure():
    snap = Cluster().node("a", 2).job("run", {"a": (0,)}).snapshot()

    def mover(snapshot, config):
        move = Migrate(
            job_id="run", placement=[NodeGpus(node="a", gpus=(1,))], reason="x", reason_code=ReasonCode.MANUAL
        )
        return RuleOutput([move], {})

    rules = {"mover": Rule(name="mover", decide=mover)}
    for section, expected in (({"on_target_failure": "requeue"}, "requeue"), ({}, "restart_source")):
        config = parse_config({"decider": {"rules_dir": "plugins"}, "strategies": {"mover": section}}, env={})
        [decision] = asyncio.run(EngineCore(runner=InlineRunner()).evaluate(snap, rules, config)).decisions
        assert decision.on_target_failure == expected
