"""The spans a decision links, as its evidence names them: a move request's, a telemetry sample's."""

from services.decider.evidence_links import MAX_LINKS, evidence_links
from services.decider.rules import oom_protection
from services.decider.rules.drain import decide as drain
from services.decider.rules.oom_protection import OomSettings
from services.decider.snapshot import MoveRequest
from shared.contracts.strategies import Drain
from tests.unit.decider.builders import Cluster

REQUEST = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SAMPLE = "00-11111111111111111111111111111111-2222222222222222-01"


def test_a_requested_move_names_the_request_span_and_links_it_with_its_id():
    from dataclasses import replace

    c = Cluster().node("a", 2).node("b", 2).job("j", {"a": (0,)})
    asked = MoveRequest("r1", "j", None, "user:ops", "ops asked", trace_parent=REQUEST)
    [move] = drain(replace(c.snapshot(), move_requests=(asked,)), Drain()).actions
    assert move.evidence["request_id"] == "r1" and move.evidence["traceparent"] == REQUEST
    [link] = evidence_links(move.evidence)
    assert format(link.context.trace_id, "032x") == REQUEST.split("-")[1]
    assert format(link.context.span_id, "016x") == REQUEST.split("-")[2]
    assert dict(link.attributes) == {"adc.request_id": "r1"}
    untraced = MoveRequest("r2", "j", None, "user:ops", "ops asked")
    [move] = drain(replace(c.snapshot(), move_requests=(untraced,)), Drain()).actions
    assert "traceparent" not in move.evidence and evidence_links(move.evidence) == []


def test_an_oom_decision_quotes_the_samples_it_acted_on_and_links_the_traced_one():
    c = Cluster().node("a", 2).node("b", 2).job("j", {"a": (0,)}).memory("a", 0, 0.95, 40)
    c.traced("a", 3, SAMPLE)  # 3 s ago, inside the hot spell
    [action] = oom_protection.decide(c.snapshot(), OomSettings(threshold_memory_usage=0.92, for_s=30)).actions
    [hot] = action.evidence["hot_gpus"]
    assert hot["gpu"] == "a:0" and hot["latest"] == 0.95 and hot["latest_ts"] == c.now
    assert hot["traced_sample"] == {"node": "a", "ts": c.now - 3, "traceparent": SAMPLE}
    [link] = evidence_links(action.evidence)
    assert format(link.context.span_id, "016x") == SAMPLE.split("-")[2]
    assert dict(link.attributes) == {"adc.node": "a", "adc.ts": c.now - 3}


def test_a_traced_sample_before_the_spell_is_not_its_evidence():
    c = Cluster().node("a", 2).node("b", 2).job("j", {"a": (0,)}).memory("a", 0, 0.95, 40)
    c.traced("a", 60, SAMPLE)  # the node was cool then
    [action] = oom_protection.decide(c.snapshot(), OomSettings(threshold_memory_usage=0.92, for_s=30)).actions
    assert "traced_sample" not in action.evidence["hot_gpus"][0] and evidence_links(action.evidence) == []


def test_a_bad_traceparent_in_evidence_links_nothing_and_links_are_bounded():
    assert evidence_links({"request_id": "r", "traceparent": "00-bad-01"}) == []
    assert evidence_links({"traceparent": {"nested": SAMPLE}}) == []
    many = {"hot_gpus": [{"gpu": f"a:{i}", "traced_sample": {"traceparent": SAMPLE}} for i in range(40)]}
    assert len(evidence_links(many)) == MAX_LINKS
    deep = {"a": {"b": {"c": {"d": {"traceparent": SAMPLE}}}}}
    assert evidence_links(deep) == []
