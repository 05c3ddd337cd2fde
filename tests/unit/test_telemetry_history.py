"""The api's hour of telemetry: bucket means, absent values, and a bound that holds at any rate."""

from __future__ import annotations

import math

from services.api.telemetry_history import SLOTS, STEP_S, TelemetryHistory
from shared.contracts.messages import GpuSample, NodeMetrics

T0 = 1_800_000_000.0  # a bucket boundary (a multiple of STEP_S)


def sample(util: float, used: int, temperature: float | None = None) -> NodeMetrics:
    gpus = [
        GpuSample(index=0, memory_total_bytes=100, memory_used_bytes=used, util_pct=util, temperature_c=temperature),
        GpuSample(index=1, memory_total_bytes=100, memory_used_bytes=0, util_pct=0.0),
    ]
    return NodeMetrics(node="n1", ts=T0, gpus=gpus, cpu_pct=50.0, mem_used_bytes=1, mem_total_bytes=4)


def test_each_bucket_holds_the_mean_of_its_samples_and_none_where_no_sensor():
    history = TelemetryHistory()
    history.add(sample(20.0, 10), T0 + 1)
    history.add(sample(40.0, 30), T0 + 2)
    history.add(sample(90.0, 50, temperature=61.0), T0 + STEP_S + 1)
    view = history.nodes["n1"].view(T0 + STEP_S + 2)
    assert view["ts"] == [T0, T0 + STEP_S]
    assert view["gpus"][0]["util_pct"] == [30.0, 90.0]
    assert view["gpus"][0]["memory_pct"] == [20.0, 50.0]
    assert view["gpus"][0]["temperature_c"] == [None, 61.0]  # the first bucket's samples had no sensor
    assert view["cpu_pct"] == [50.0, 50.0] and view["mem_pct"] == [25.0, 25.0]


def test_an_hour_is_kept_whatever_the_rate_and_older_buckets_are_reused():
    history = TelemetryHistory()
    for k in range(3 * SLOTS):  # three hours, two samples a bucket
        for half in (0.2, 0.7):
            history.add(sample(float(k % 100), k % 100), T0 + (k + half) * STEP_S)
    ring = history.nodes["n1"].ring
    assert ring.sums.shape[0] == SLOTS  # fixed size: a bucket per STEP_S for an hour
    now = T0 + (3 * SLOTS - 0.5) * STEP_S
    view = history.nodes["n1"].view(now)
    assert len(view["ts"]) == SLOTS
    assert view["ts"][0] == T0 + 2 * SLOTS * STEP_S and view["ts"][-1] == T0 + (3 * SLOTS - 1) * STEP_S
    assert view["gpus"][0]["util_pct"][-1] == float((3 * SLOTS - 1) % 100)
    # An hour later with nothing new, nothing is left.
    assert history.nodes["n1"].view(now + SLOTS * STEP_S + STEP_S)["ts"] == []


def test_a_late_sample_for_a_reused_bucket_is_dropped_not_mixed_in():
    history = TelemetryHistory()
    history.add(sample(80.0, 1), T0 + SLOTS * STEP_S + 1)  # this row now holds a bucket an hour on
    history.add(sample(10.0, 1), T0 + 1)  # a sample for the bucket it held before
    view = history.nodes["n1"].view(T0 + SLOTS * STEP_S + 2)
    assert view["gpus"][0]["util_pct"] == [80.0]


def test_cluster_points_count_reporting_allocated_and_busy_gpus():
    history = TelemetryHistory()
    latest = [sample(30.0, 10), sample(2.0, 10)]  # 4 GPUs: 1 busy (30 %), 3 under the busy threshold
    history.cluster_tick(T0 + 1, latest, allocated=2)
    history.cluster_tick(T0 + 2, latest, allocated=3)
    view = history.cluster_view(T0 + 3)
    assert view == {"ts": [T0], "gpus": [4.0], "allocated": [2.5], "busy": [1.0]}
    assert not math.isnan(view["busy"][0])
