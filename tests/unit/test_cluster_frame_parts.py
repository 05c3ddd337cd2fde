"""A node's part of the live cluster frame, written directly (cluster_frames._frame_of), is the text
json.dumps writes for node_frame less its sample time: the same keys, order and values, whatever
the readings hold (absent sensors, odd floats, names to escape) and whoever asks."""

from __future__ import annotations

import json
import math

import pytest

from services.api.auth import Principal
from services.api.cluster_frames import _frame_of, node_frame
from shared.contracts.messages import GpuSample, NodeMetrics

USER = Principal("t1", "alice", "user", "alpha")
ADMIN = Principal("t2", "root", "admin", "ops")
HOLDERS = {("n-é", 0): ("job-a", "alpha"), ("n-é", 1): ("job-b", "beta")}


def samples() -> list[NodeMetrics]:
    odd = [0.0, -0.0, 1e-7, 123456789.125, 1e22, math.inf, -math.inf, math.nan, 7]
    gpus = [
        GpuSample(
            index=i,
            name=["H100", 'A "quoted" \\ név\n', ""][i % 3],
            memory_used_bytes=i * 2**33,
            memory_total_bytes=80 * 2**30,
            util_pct=odd[i],
            temperature_c=None if i % 2 else odd[-1 - i],
            power_w=odd[i] if i % 3 else None,
        )
        for i in range(len(odd))
    ]
    return [
        NodeMetrics(node="n-é", ts=1.5, gpus=gpus, cpu_pct=12, mem_used_bytes=2**40, mem_total_bytes=2**41),
        NodeMetrics(node="bare", ts=2.0),
    ]


@pytest.mark.parametrize("who", [USER, ADMIN], ids=["user", "admin"])
def test_a_part_is_what_json_dumps_writes_for_the_node_frame(who):
    for sample in samples():
        frame = node_frame(sample, HOLDERS, who)
        del frame["ts"]
        assert _frame_of(sample, HOLDERS, who) == json.dumps(frame, separators=(",", ":"))
