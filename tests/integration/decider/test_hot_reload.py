"""Hot reload on the real NATS and Postgres: rule plugins and adc_config.yaml change under a
running decider; good versions take effect without a restart, bad ones leave the previous
version running and are audited with the file and the error."""

from tests.integration.decider.live_decider import LiveDecider

PLUGIN = """
from services.decider.plugin import Rule, RuleConfig
from shared.contracts.actions import Preempt


class Config(RuleConfig):
    cooldown_s: float = 0.3
    label: str = "{label}"


def decide(snapshot, config):
    return [Preempt(job_id=j.id, reason=f"{{config.label}}: test plugin requeues {{j.id}}")
            for j in snapshot.running() if j.name.startswith("victim")]


RULE = Rule(name="requeue_victims", decide=decide, config=Config, description="test plugin")
"""


def preempts(live, label):
    return [d for d in live.decisions if d.rule == "requeue_victims" and d.action.reason.startswith(label)]


async def test_plugins_load_swap_and_survive_broken_versions(isolated, tmp_path):
    plugin = tmp_path / "rules" / "requeue.py"
    async with LiveDecider(isolated, tmp_path) as live:
        await live.node("n1")
        await live.job("victim-1", status="running", placement=[{"node": "n1", "gpus": [0]}])
        await live.wait_for(lambda: live.audited("rule.loaded", "priority_fifo"), what="built-in rules loaded")

        # A new plugin file takes effect without a restart.
        plugin.write_text(PLUGIN.format(label="v1"))
        await live.wait_for(lambda: live.audited("rule.loaded", "requeue.py"), what="plugin loaded")
        [first] = await live.wait_for(lambda: preempts(live, "v1"), what="a decision from the plugin")
        assert first.action.job_id == "victim-1" and first.action.action == "preempt"
        audit = await live.wait_for(
            lambda: [a for a in live.audited("decision") if a.decision_id == first.decision_id],
            what="the decision's audit event",
        )
        assert audit[0].rule == "requeue_victims" and "test plugin requeues" in audit[0].reason

        # A syntax error: the previous version stays in force; the audit names the file and the error.
        plugin.write_text(
            PLUGIN.format(label="v2").replace("def decide(snapshot, config):", "def decide(snapshot config):")
        )
        [failed] = await live.wait_for(
            lambda: live.audited("rule.reload_failed", "SyntaxError"), what="syntax error audit"
        )
        assert failed.data["file"] == str(plugin.resolve()) and "previous version stays in force" in failed.reason
        assert live.engine.registry.rules["requeue_victims"].source == str(plugin.resolve())
        live.engine.core.in_flight.clear()  # as if the executor had refused the first one
        count = len(preempts(live, "v1"))
        await live.wait_for(lambda: len(preempts(live, "v1")) > count, what="the previous version still deciding")

        # A plugin that raises at import, and one that raises when run: both refused, v1 still runs.
        plugin.write_text(PLUGIN.format(label="v3") + "\nraise RuntimeError('broken at import')\n")
        await live.wait_for(lambda: live.audited("rule.reload_failed", "broken at import"), what="import error audit")
        plugin.write_text(PLUGIN.format(label="v4").replace("return [", "return 1 / 0 or ["))
        [dry] = await live.wait_for(
            lambda: live.audited("rule.reload_failed", "dry run raised ZeroDivisionError"), what="dry-run failure audit"
        )
        assert "(line" in dry.reason or "requeue.py" in dry.reason

        # A good version swaps in atomically.
        plugin.write_text(PLUGIN.format(label="v5"))
        await live.wait_for(lambda: len(live.audited("rule.loaded", "requeue.py")) == 2, what="v5 loaded")
        live.engine.core.in_flight.clear()
        await live.wait_for(lambda: preempts(live, "v5"), what="a decision from v5")

        # A plugin's section is checked where plugins are known: a misspelt name is refused naming
        # the loaded rules, the right one configures the plugin.
        bad = {"strategies": {"requeue_victim": {"label": "v6"}}}
        await live.pool.execute("INSERT INTO policies (body, updated_by, reason) VALUES ($1, 'admin', 'typo')", bad)
        [refused] = await live.wait_for(lambda: live.audited("policy.apply_failed"), what="misspelt plugin refused")
        assert "strategies.requeue_victim: no rule is registered" in refused.reason
        assert "requeue_victims" in refused.reason and "oom_protection" in refused.reason
        good = {"strategies": {"requeue_victims": {"label": "v7"}}}
        await live.pool.execute("INSERT INTO policies (body, updated_by, reason) VALUES ($1, 'admin', 'fix')", good)
        await live.wait_for(lambda: live.audited("policy.applied"), what="plugin section applied")
        live.engine.core.in_flight.clear()
        await live.wait_for(lambda: preempts(live, "v7"), what="a decision with the policy's label")

        # Removing the file unloads its rule.
        plugin.unlink()
        await live.wait_for(lambda: live.audited("rule.unloaded", "requeue_victims"), what="unload audit")
        assert "requeue_victims" not in live.engine.registry.rules


async def test_config_reload_applies_good_files_and_keeps_the_previous_on_errors(isolated, tmp_path):
    async with LiveDecider(isolated, tmp_path) as live:
        await live.node("n1", gpus=1)
        await live.job("big", gpus=4)
        entry = await live.pending_reason("big", "no node has 4 free device(s)")
        assert "priority_fifo" in entry["rules"] and entry["evaluated_at"] >= entry["since"]
        assert entry["reason_code"] == "pending.never_fits"
        assert entry["rule_codes"] == {"priority_fifo": "pending.never_fits"}

        live.config_doc["strategies"]["oom_protection"] = {"for_s": 5, "shadow": True}
        live.write_config()
        [applied] = await live.wait_for(lambda: live.audited("config.reloaded"), what="config reloaded")
        assert "strategies" in applied.data["changed"]
        assert live.engine.config.strategies.oom_protection.shadow is True

        live.write_config("controller: [unclosed")
        [bad] = await live.wait_for(lambda: live.audited("config.reload_failed"), what="YAML error audit")
        assert "not valid YAML" in bad.reason and bad.data["file"] == str(live.config_path)
        live.config_doc["strategies"]["oom_protection"] = {"for_s": -1}
        live.write_config()
        await live.wait_for(lambda: live.audited("config.reload_failed", "for_s"), what="invalid value audit")
        assert live.engine.config.strategies.oom_protection.for_s == 5  # the previous config stays


async def test_policy_document_and_controller_pause_from_the_api_tables(isolated, tmp_path):
    async with LiveDecider(isolated, tmp_path) as live:
        await live.pool.execute("UPDATE controller_state SET paused = true, reason = 'maintenance', updated_by = 'ops'")
        await live.node("n1", gpus=2)
        await live.job("waiting", gpus=1)
        entry = await live.pending_reason("waiting", "the controller is paused by ops: maintenance")
        assert entry["rules"] == {"controller": "the controller is paused by ops: maintenance; no new decisions"}
        assert entry["reason_code"] == "pending.controller_paused"
        assert live.decisions == []
        await live.pool.execute("UPDATE controller_state SET paused = false")
        [start] = await live.wait_for(lambda: live.decisions, what="a start once resumed")
        assert start.action.job_id == "waiting" and start.rule == "priority_fifo"
        assert start.action.reason_code == "admit"
        [audited] = await live.wait_for(lambda: live.audited("decision"), what="the start's audit row")
        assert audited.data["reason_code"] == "admit"

        body = {"controller": {"interval": 0.2}, "strategies": {"oom_protection": {"for_s": 7}}, "schedules": []}
        await live.pool.execute("INSERT INTO policies (body, updated_by, reason) VALUES ($1, 'admin', 'test')", body)
        [applied] = await live.wait_for(lambda: live.audited("policy.applied"), what="policy applied")
        assert applied.data["version"] == 1 and live.engine.config.strategies.oom_protection.for_s == 7
        bad = {"strategies": {"oom_protection": {"for_s": "long"}}}
        await live.pool.execute("INSERT INTO policies (body, updated_by, reason) VALUES ($1, 'admin', 'bad')", bad)
        [failed] = await live.wait_for(lambda: live.audited("policy.apply_failed"), what="bad policy refused")
        assert "version 1 stays in force" in failed.reason and "strategies.oom_protection.for_s" in failed.reason
        assert live.engine.config.strategies.oom_protection.for_s == 7
