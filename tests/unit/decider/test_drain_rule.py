"""The drain rule over built snapshots: requested moves completed, draining nodes emptied, then cordoned."""

from services.decider.rules.drain import decide
from services.decider.snapshot import MoveRequest
from shared.contracts.job_status import JobStatus
from shared.contracts.strategies import Drain
from tests.unit.decider.builders import Cluster


def _with_requests(snapshot, *requests):
    from dataclasses import replace

    return replace(snapshot, move_requests=tuple(requests))


def test_a_requested_move_goes_to_the_named_node_or_any_other_with_room():
    c = Cluster().node("a", 2).node("b", 2).node("c", 4).job("j", {"a": (0,)})
    named = MoveRequest("r1", "j", "b", "user:ops", "ops asked to migrate it to b")
    [move] = decide(_with_requests(c.snapshot(), named), Drain()).actions
    assert move.placement[0].node == "b" and move.evidence["request_id"] == "r1"
    assert "asked by user:ops" in move.reason
    anywhere = MoveRequest("r2", "j", None, "user:ops", "ops asked to migrate it to any node with room")
    [move] = decide(_with_requests(c.snapshot(), anywhere), Drain()).actions
    assert move.placement[0].node == "b"  # best fit: the tighter of b and c, never its own node a


def test_a_request_without_room_or_for_a_job_that_is_not_running_waits():
    c = Cluster().node("a", 1).node("b", 1).job("j", {"a": (0,)}).job("k", {"b": (0,)})
    c.pending("p")
    requests = [MoveRequest("r1", "j", None, "x", "r"), MoveRequest("r2", "p", None, "x", "r")]
    assert decide(_with_requests(c.snapshot(), *requests), Drain()).actions == []


def test_a_draining_node_is_emptied_then_cordoned():
    c = Cluster().node("a", 2).node("b", 1).job("j1", {"a": (0,)}).job("j2", {"a": (1,)})
    snap = c.snapshot()
    from dataclasses import replace

    nodes = dict(snap.nodes, a=replace(snap.nodes["a"], status="draining", schedulable=False))
    actions = decide(replace(snap, nodes=nodes), Drain()).actions
    assert sorted((a.action, a.job_id) for a in actions) == [("migrate", "j1"), ("preempt", "j2")]
    assert next(a for a in actions if a.action == "migrate").placement[0].node == "b"
    empty = Cluster().node("a", 2).node("b", 1).job("s", {"a": (0,)}, status=JobStatus.SUCCEEDED).snapshot()
    nodes = dict(empty.nodes, a=replace(empty.nodes["a"], status="draining", schedulable=False))
    [cordon] = decide(replace(empty, nodes=nodes), Drain()).actions
    assert cordon.action == "cordon" and cordon.node == "a" and "drain of a done" in cordon.reason
