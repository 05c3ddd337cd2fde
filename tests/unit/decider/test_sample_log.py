"""The frozen telemetry a pass gets shares the sample logs instead of copying them: it must stay
exactly as it was frozen while ingest goes on, also across a compaction of the logs, and answer
as a view frozen from a cluster that never saw the later samples."""

import numpy as np
import pytest

from services.decider.cluster_view import ClusterView
from shared.contracts.messages import GpuSample, NodeMetrics


def sample(t: int, node: str = "a") -> NodeMetrics:
    # GPU 1's memory climbs over the threshold and stays; GPU 0 follows a saw-tooth.
    return NodeMetrics(
        node=node,
        ts=1000.0 + t,
        cpu_pct=float(t % 7) * 10,
        gpus=[
            GpuSample(index=0, memory_used_bytes=(t % 10) * 10, memory_total_bytes=100, util_pct=float(t % 5) * 20),
            GpuSample(index=1, memory_used_bytes=95 if t >= 9 else 50, memory_total_bytes=100),
        ],
    )


def answers(view, now: float) -> tuple:
    tv = view.freeze(now) if isinstance(view, ClusterView) else view
    hot = [(h.node, h.gpu, h.since, h.values) for h in tv.hot_gpus("gpu_memory", 0.92, 5)]
    return (
        hot,
        tv.node_means("cpu", 8),
        tv.node_means("gpu_util", 8),
        tv.gpu_mean("gpu_memory", "a", 0, 6),
        tv.node_age_s("a"),
        tv.gpu_latest("a", 1),
    )


def test_a_frozen_view_keeps_its_answers_while_ingest_goes_on_and_the_logs_compact():
    view = ClusterView(window_s=10)  # 12 samples of window, 24 columns: compacts every 12 or so samples
    for t in range(20):
        view.ingest(sample(t))
    frozen = view.freeze(1019.5)
    before = answers(frozen, 1019.5)
    compactions = view.store.compactions
    for t in range(20, 60):
        view.ingest(sample(t))
    assert view.store.compactions > compactions  # the logs were moved to new arrays meanwhile
    assert answers(frozen, 1019.5) == before

    fresh = ClusterView(window_s=10)  # the same samples, never compacted past t=19
    for t in range(20):
        fresh.ingest(sample(t))
    assert answers(fresh, 1019.5) == before
    [(node, gpu, since, values)] = before[0]
    assert (node, gpu, since) == ("a", 1, 1009.0) and values[-1] == pytest.approx(0.95)


def test_after_many_compactions_the_window_holds_the_newest_samples():
    view = ClusterView(window_s=10)
    for t in range(200):
        view.ingest(sample(t))
    tv = view.freeze(1199.5)
    width = view.store.width
    # cpu of the last `width` samples, newest first, as the window must hold them
    expected = np.mean([(t % 7) * 10 / 100 for t in range(200 - width, 200) if 1199.5 - (1000 + t) <= 100])
    assert tv.node_means("cpu", 100)["a"] == pytest.approx(expected)
    assert tv.node_age_s("a") == pytest.approx(0.5)
    [spell] = tv.hot_gpus("gpu_memory", 0.92, 5)
    assert spell.since == 1000.0 + 200 - width  # hot since t=9, but the window reaches back only `width` samples


def test_compactions_write_the_previous_logs_again_once_no_view_holds_them():
    view = ClusterView(window_s=10)
    logs, held = set(), None
    for t in range(200):
        view.ingest(sample(t))
        logs.add(id(view.store.gpu_values["gpu_memory"]))
        if t == 100:
            held = view.freeze(1100.0)  # a view kept across the next compactions: its logs are not reused
    assert view.store.compactions >= 10
    assert len(logs) == 3  # two sets in turn, and one more for as long as `held` keeps its own
    assert held.hot_gpus("gpu_memory", 0.92, 5)[0].latest_ts == 1100.0


def test_a_compaction_moves_each_rows_window_whatever_the_nodes_ends():
    """Rows are moved by slices of the rows that share a window start: the same columns as gathering
    each row's `width` columns from `end - filled` (clipped at the last column) would give."""
    from services.decider.metric_windows import SampleLog

    rng = np.random.default_rng(7)
    log = SampleLog(5, ("m",), ("cpu",), nodes=6, gpu_rows=12)
    for node in range(6):
        log.add_node()
        log.add_rows(node, range(2))
    log.gpu_values["m"][:] = rng.random(log.gpu_values["m"].shape, dtype=np.float32)
    log.node_times[:] = rng.random(log.node_times.shape)
    log.node_end[:6] = [10, 10, 9, 3, 0, 10]  # in step, behind, barely started, silent, ...
    log.node_filled[:6] = [5, 5, 5, 3, 0, 1]  # ... and one whose window runs past the last column
    w, last = log.width, log.columns - 1

    def gathered(values, owner):
        start = log.node_end[owner] - log.node_filled[owner]
        return np.take_along_axis(values, np.clip(start[:, None] + np.arange(w)[None, :], 0, last), axis=1)

    expected_gpu = gathered(log.gpu_values["m"], log.row_node)
    expected_times = gathered(log.node_times, np.arange(len(log.node_end)))
    log._compact()
    assert np.array_equal(log.gpu_values["m"][:, :w], expected_gpu)
    assert np.array_equal(log.node_times[:, :w], expected_times)
