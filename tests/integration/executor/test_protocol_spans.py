"""Each protocol step is a span of its own, inside the span of the decision that began it, so a
job's trace shows where a move spent its time (here: a warm migrate through its four steps)."""

from __future__ import annotations

from shared.contracts.actions import Migrate, NodeGpus
from tests.spans import recording_spans


async def test_a_migrate_is_one_span_per_step_inside_its_decision(ex):
    spans = recording_spans()
    a, b = await ex.worker(), await ex.worker()
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="test", placement=[NodeGpus(node=b.node, gpus=(1,))]))
    assert await ex.settled(did) == "done"
    mine = [s for s in spans.get_finished_spans() if s.attributes.get("adc.job_id") == job_id]
    [decision] = [s for s in mine if s.name == "decision migrate"]
    steps = sorted((s for s in mine if s.attributes.get("adc.protocol") == did), key=lambda s: s.start_time)
    assert [s.name for s in steps] == [
        "migrate preparing",
        "migrate stopping",
        "migrate placing",
        "migrate starting_target",
    ]
    assert all(
        s.context.trace_id == decision.context.trace_id and s.parent.span_id == decision.context.span_id for s in steps
    )
    spans.clear()
