"""Window predicates over the metric rings: trigger, the edges that must not trigger,
hysteresis, gaps and staleness, and the watches that wake the engine."""

import numpy as np
import pytest

from services.decider.cluster_view import ClusterView, Watch
from services.decider.metric_windows import hot_spells
from shared.contracts.messages import GpuSample, NodeMetrics
from tests.unit.decider.builders import Cluster


def hot(cluster, above=0.92, for_s=30, clear_below=None):
    snap = cluster.snapshot()
    return [(h.node, h.gpu) for h in snap.telemetry.hot_gpus("gpu_memory", above, for_s, clear_below=clear_below)]


@pytest.mark.parametrize(
    "fraction,held_s,expected",
    [
        (0.93, 31, [("a", 1)]),  # above for longer than the window
        (0.93, 30, [("a", 1)]),  # exactly the window: 31 samples span 30 s
        (0.93, 29, []),  # one second short
        (0.92, 60, []),  # at the threshold is not above it
        (0.9201, 60, [("a", 1)]),
    ],
)
def test_memory_above_threshold_for_the_window(fraction, held_s, expected):
    assert hot(Cluster().node("a", 2).memory("a", 1, fraction, held_s)) == expected


def test_hysteresis_a_dip_inside_the_band_does_not_reset_the_window():
    # 0.95 for 40 s, but 20 s ago it dipped to 0.91 for a moment (still above clear_below 0.90).
    c = Cluster().node("a", 1).memory("a", 0, 0.95, 40).memory("a", 0, 0.91, 20).memory("a", 0, 0.95, 19)
    assert hot(c, clear_below=0.90) == [("a", 0)]
    assert hot(c) == []  # without hysteresis the dip restarts the window


def test_a_dip_below_the_band_resets_the_window():
    c = Cluster().node("a", 1).memory("a", 0, 0.95, 40).memory("a", 0, 0.85, 20).memory("a", 0, 0.95, 19)
    assert hot(c, clear_below=0.90) == []
    assert hot(c, for_s=19, clear_below=0.90) == [("a", 0)]


def test_a_gap_in_telemetry_breaks_the_window_and_stale_data_triggers_nothing():
    gap = Cluster().node("a", 1).memory("a", 0, 0.95, 60).silent("a", 20, 10)
    assert hot(gap) == []
    stale = Cluster().node("a", 1).memory("a", 0, 0.95, 60).silent("a", 10)
    assert hot(stale) == []


def test_evidence_carries_the_window_values():
    snap = Cluster().node("a", 1).memory("a", 0, 0.95, 35).snapshot()
    [spell] = snap.telemetry.hot_gpus("gpu_memory", 0.92, 30)
    ev = spell.evidence()
    assert ev["gpu"] == "a:0" and ev["threshold"] == 0.92 and ev["duration_s"] == 35
    assert ev["window_satisfied_at"] == pytest.approx(ev["above_since"] + 30)
    assert ev["window"][-1] == 0.95 and ev["peak"] == 0.95 and len(ev["window"]) == 30


def test_hot_spells_vectorized_over_many_rows():
    rng = np.random.default_rng(1)
    rows, width = 8000, 64
    values = rng.uniform(0, 0.9, (rows, width)).astype(np.float32)
    values[::100, :40] = 0.95  # newest 40 samples hot on every 100th GPU
    times = np.tile(1000.0 - np.arange(width, dtype=float), (rows, 1))
    spells = hot_spells(
        values,
        times,
        np.full(rows, width),
        1000.5,
        above=0.92,
        for_s=30,
        clear_below=None,
        max_gap_s=3.5,
        stale_after_s=5,
    )
    assert list(spells.rows) == list(range(0, rows, 100))
    assert set(spells.since) == {961.0}


def test_watch_wakes_once_when_the_window_is_satisfied_and_rearms_after_cooling():
    woken = []
    view = ClusterView(window_s=60, on_wake=woken.append)
    view.set_watches([Watch("gpu_memory", 0.92, 3, clear_below=0.9, label="oom")])

    def sample(t, fraction):
        view.ingest(
            NodeMetrics(
                node="a",
                ts=1000.0 + t,
                gpus=[GpuSample(index=0, memory_used_bytes=int(fraction * 100), memory_total_bytes=100)],
            )
        )

    for t in range(3):
        sample(t, 0.95)
    assert woken == []
    sample(3, 0.95)
    assert woken == ["oom window satisfied on a:0"]
    sample(4, 0.95)
    sample(5, 0.5)
    for t in range(6, 10):
        sample(t, 0.95)
    assert len(woken) == 2


def test_a_node_whose_inventory_grows_keeps_answering_for_its_current_gpus():
    view = ClusterView(window_s=30)
    for t in range(10):
        gpus = 2 if t < 5 else 4  # two GPUs added at t=5: a fresh block of rows
        view.ingest(
            NodeMetrics(
                node="a",
                ts=1000.0 + t,
                cpu_pct=50.0,
                gpus=[
                    GpuSample(index=i, memory_used_bytes=95 if i == 3 else 10, memory_total_bytes=100)
                    for i in range(gpus)
                ],
            )
        )
    tv = view.freeze(1009.5)
    assert [(h.node, h.gpu) for h in tv.hot_gpus("gpu_memory", 0.92, 3)] == [("a", 3)]
    assert tv.node_means("gpu_memory", 30)["a"] == pytest.approx((0.1 * 3 + 0.95) / 4)
    assert tv.node_means("cpu", 30) == {"a": pytest.approx(0.5)}
