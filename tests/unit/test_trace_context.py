"""The traceparent ADC accepts from outside, and the telemetry message that may carry one."""

import pytest

from shared.contracts.messages import NodeMetrics
from shared.contracts.trace_context import valid_traceparent

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_well_formed_traceparent_is_kept():
    assert valid_traceparent(GOOD) == GOOD
    assert valid_traceparent(GOOD[:-2] + "00") == GOOD[:-2] + "00"  # unsampled flags are still a context


@pytest.mark.parametrize(
    "bad",
    [
        None,
        42,
        "",
        GOOD.upper(),
        GOOD + "-extra",  # a later version's tail: not accepted
        "01" + GOOD[2:],  # only version 00
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",  # all-zero span id
        GOOD.replace("-", "_"),
        GOOD[:-1] + "\n",
        "x" * 100_000,
    ],
)
def test_anything_else_is_dropped(bad):
    assert valid_traceparent(bad) is None


def test_node_metrics_keep_a_good_traceparent_and_drop_a_bad_one_not_the_sample():
    sample = NodeMetrics(node="n1", ts=1.0, trace_parent=GOOD)
    assert NodeMetrics.decode(sample.encode()).trace_parent == GOOD
    bad = sample.model_dump() | {"trace_parent": "00-not-a-trace-01", "cpu_pct": 50.0}
    read = NodeMetrics.model_validate(bad)
    assert read.trace_parent is None and read.cpu_pct == 50.0


def test_the_field_is_optional_both_ways():
    """An older collector's message reads with no traceparent; an older reader ignores the field."""
    old = NodeMetrics(node="n1", ts=1.0).model_dump(exclude={"trace_parent"})
    assert NodeMetrics.model_validate(old).trace_parent is None
    assert "trace_parent" in NodeMetrics.model_fields and NodeMetrics.model_config["extra"] == "ignore"
