"""The traceparent ADC accepts from outside."""

import pytest

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
