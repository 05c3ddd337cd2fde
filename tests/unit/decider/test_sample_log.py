"""The frozen telemetry a pass gets shares the sample logs instead of copying them: it must stay
exactly as it was frozen while ingest goes on, also across a compaction of the logs, and answer
as a view frozen from a cluster that never saw the later samples."""
import numpy as np
import pytest

from services.decider.cluster_view import ClusterView
from shared.messages import GpuSample, NodeMetrics


def sample(t: int, node: str = "a") -> NodeMetrics:
    # GPU 1's memory climbs over the threshold and stays; GPU 0 follows a saw-tooth.
    return NodeMetrics(node=node, ts=1000.0 + t, cpu_pct=float(t % 7) * 10, gpus=[
        GpuSample(index=0, memory_used_bytes=(t % 10) * 10, memory_total_bytes=100, util_pct=float(t % 5) * 20),
        GpuSample(index=1, memory_used_bytes=95 if t >= 9 else 50, memory_total_bytes=100)])


def answers(view, now: float) -> tuple:
    tv = view.freeze(now) if isinstance(view, ClusterView) else view
    hot = [(h.node, h.gpu, h.since, h.values) for h in tv.hot_gpus("gpu_memory", 0.92, 5)]
    return (hot, tv.node_means("cpu", 8), tv.node_means("gpu_util", 8), tv.gpu_mean("gpu_memory", "a", 0, 6),
            tv.node_age_s("a"), tv.gpu_latest("a", 1))


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
    log.node_end[:6] = [10, 10, 9, 3, 0, 10]   # in step, behind, barely started, silent, ...
    log.node_filled[:6] = [5, 5, 5, 3, 0, 1]   # ... and one whose window runs past the last column
    w, last = log.width, log.columns - 1

    def gathered(values, owner):
        start = log.node_end[owner] - log.node_filled[owner]
        return np.take_along_axis(values, np.clip(start[:, None] + np.arange(w)[None, :], 0, last), axis=1)

    expected_gpu = gathered(log.gpu_values["m"], log.row_node)
    expected_times = gathered(log.node_times, np.arange(len(log.node_end)))
    log._compact()
    assert np.array_equal(log.gpu_values["m"][:, :w], expected_gpu)
    assert np.array_equal(log.node_times[:, :w], expected_times)


def test_a_batch_is_stored_and_watched_exactly_as_its_samples_one_by_one():
    """`ingest_many` against `ingest` of each sample: the same logs (compactions within a batch), the same
    newest values, first samples, watch states, wakes in the same order, and the same frozen answers;
    with nodes appearing and growing GPUs mid-batch, GPUs missing from a sample, gaps, and spells that
    satisfy watches."""
    from services.decider.cluster_view import Watch

    rng = np.random.default_rng(11)
    clock = {n: 1000.0 for n in "abcde"}
    samples = []
    for _ in range(600):
        node = "abcde"[int(rng.integers(5))]
        clock[node] += 1.0 if rng.random() > 0.05 else 6.0  # now and then a gap past max_gap_s
        count = 6 if rng.random() < 0.02 else 3  # a node's inventory grows now and then
        present = [g for g in range(count) if rng.random() > 0.1]  # some GPUs missing from a sample
        gpus = [GpuSample(index=g, memory_used_bytes=int(rng.choice([50, 86, 90, 93, 99])), memory_total_bytes=100,
                          util_pct=float(rng.choice([0.0, 40.0, 80.0]))) for g in present]
        latency = {"job-1": [float(rng.random())]} if rng.random() < 0.1 else {}
        samples.append(NodeMetrics(node=node, ts=clock[node], cpu_pct=float(rng.integers(100)), gpus=gpus,
                                   comm_latency_us=latency))
    watches = [Watch("gpu_memory", 0.92, 3.0, clear_below=0.85, label="oom"), Watch("gpu_util", 0.5, 2.0)]
    woken: dict[str, list[str]] = {"one": [], "batch": []}
    one = ClusterView(window_s=6, on_wake=woken["one"].append)
    batched = ClusterView(window_s=6, on_wake=woken["batch"].append)
    for view in (one, batched):
        view.set_watches(watches)

    def state(view: ClusterView) -> tuple:
        s = view.store
        arrays = [s.node_times, s.node_end, s.node_filled, s.row_since, s.row_node, s.row_gpu,
                  *s.node_values.values(), *s.gpu_values.values(), *s.gpu_latest.values()]
        arrays += [a for w in view._watches for a in (w.since, w.fired)]
        return ([a.tobytes() for a in arrays], s.compactions, view.samples_ingested, sorted(view._fired, key=str),
                {j: {n: r.copy()[1].tolist() for n, r in by.items()} for j, by in view.comm.items()})

    done, fired = 0, 0
    while done < len(samples):
        size = int(rng.integers(1, 40))
        for m in samples[done:done + size]:
            one.ingest(m)
        batched.ingest_many(samples[done:done + size])
        done += size
        assert state(one) == state(batched)
        assert woken["one"] == woken["batch"]
        now = max(clock.values()) + 0.5
        assert answers(one.freeze(now), now) == answers(batched.freeze(now), now)
        fired += len(one.take_fired())
        batched.take_fired()
    assert one.store.compactions > 10 and fired > 0 and len(woken["one"]) > 5
