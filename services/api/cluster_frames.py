"""The live cluster view's frames: built at most once a second per audience, shared by every stream.

An audience is everyone who sees the same thing: operators and admins see every holder's job id,
a user sees their own team's and "(another team)" for the rest. Each node's part of the frame is
encoded once per build, whatever the number of clients. A stream sends every node first, then
only the nodes whose part changed since the frame it sent last, so nodes whose readings hold
still (idle GPUs, a node between samples) cost neither the api nor the page anything.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from sse_starlette import ServerSentEvent

from services.api.auth import Principal
from services.api.cluster_feed import ClusterFeed
from shared.contracts.messages import NodeMetrics

MIN_GAP_S = 1.0  # at most one build a second per audience, however many nodes report
OTHER_TEAM = "(another team)"


def holder_label(who: Principal, job_id: str, team: str) -> str:
    """What the caller may know of the job holding a device: its id, or only that it is taken."""
    return job_id if who.may_act_on_team(team) else OTHER_TEAM


def audience(who: Principal) -> str:
    return "*" if who.sees_all else f"team:{who.team}"


def node_frame(sample: NodeMetrics, holders: dict, who: Principal) -> dict[str, Any]:
    """One node's latest sample as the caller may see it (another team's job is only 'taken')."""
    gpus = []
    for g in sample.gpus:
        held = holders.get((sample.node, g.index))
        gpus.append(
            {
                "index": g.index,
                "name": g.name,
                "memory_used_bytes": g.memory_used_bytes,
                "memory_total_bytes": g.memory_total_bytes,
                "util_pct": g.util_pct,
                "temperature_c": g.temperature_c,
                "power_w": g.power_w,
                "job_id": holder_label(who, *held) if held else None,
            }
        )
    return {
        "node": sample.node,
        "ts": sample.ts,
        "cpu_pct": sample.cpu_pct,
        "mem_used_bytes": sample.mem_used_bytes,
        "mem_total_bytes": sample.mem_total_bytes,
        "gpus": gpus,
    }


def _float(x: float) -> str:
    """As json.dumps writes a float."""
    if math.isfinite(x):
        return float.__repr__(float(x))
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


def _maybe(x: float | None) -> str:
    return "null" if x is None else _float(x)


def _frame_of(sample: NodeMetrics, holders: dict, who: Principal) -> str:
    """A node's part, without its sample time (a resent identical reading is no change): node_frame's
    keys in its order, as json.dumps would write them, written directly, as a thousand nodes' parts
    are encoded each second."""
    text = encode_basestring_ascii
    gpus = []
    for g in sample.gpus:
        held = holders.get((sample.node, g.index))
        job = text(holder_label(who, *held)) if held else "null"
        gpus.append(
            f'{{"index":{int(g.index)},"name":{text(g.name)},"memory_used_bytes":{int(g.memory_used_bytes)},'
            f'"memory_total_bytes":{int(g.memory_total_bytes)},"util_pct":{_float(g.util_pct)},'
            f'"temperature_c":{_maybe(g.temperature_c)},"power_w":{_maybe(g.power_w)},"job_id":{job}}}'
        )
    return (
        f'{{"node":{text(sample.node)},"cpu_pct":{_float(sample.cpu_pct)},'
        f'"mem_used_bytes":{int(sample.mem_used_bytes)},"mem_total_bytes":{int(sample.mem_total_bytes)},'
        f'"gpus":[{",".join(gpus)}]}}'
    )


@dataclass
class AudienceFrames:
    """One audience's encoded node parts, each with the build (`version`) that last changed it."""

    who: Principal
    parts: dict[str, tuple[int, str]] = field(default_factory=dict)
    version: int = 0
    built_at: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    epoch: str = field(default_factory=lambda: secrets.token_hex(4))  # this process's builds, not another api's
    sources: dict[str, NodeMetrics] = field(default_factory=dict)  # the sample each part was made of
    holders: dict | None = None  # the holders the parts were made with

    def since(self, version: int) -> list[str]:
        """The parts changed after build `version` (every part for 0)."""
        return [text for changed, text in self.parts.values() if changed > version]

    @property
    def token(self) -> str:
        """Which build a client holds, for it to ask for what changed after (`since`)."""
        return f"{self.epoch}.{self.version}"

    def version_of(self, token: str | None) -> int:
        """The build a client's token names; 0 (send everything) for another process's or a bad one."""
        epoch, _, version = (token or "").partition(".")
        return int(version) if epoch == self.epoch and version.isdigit() and int(version) <= self.version else 0


class ClusterFrames:
    def __init__(self, feed: ClusterFeed) -> None:
        self.feed = feed
        self._audiences: dict[str, AudienceFrames] = {}

    async def latest(self, who: Principal, max_age_s: float = MIN_GAP_S) -> AudienceFrames:
        """The caller's audience's frames, rebuilt first if the last build is `max_age_s` old."""
        frames = self._audiences.setdefault(audience(who), AudienceFrames(who))
        async with frames.lock:  # one build at a time: the other streams of the audience wait for it
            if self.feed.clock.monotonic() - frames.built_at >= max_age_s:
                frames.built_at = self.feed.clock.monotonic()
                await self._build(frames)
        return frames

    async def _build(self, frames: AudienceFrames) -> None:
        """Re-encode the nodes with a new sample since the last build (all of them when a device
        changed hands): a node that has not reported since costs nothing."""
        holders = await self.feed.holders()
        fresh_holders = holders != frames.holders  # the feed re-reads them every HOLDERS_TTL_S
        version = frames.version + 1
        seen = set()
        for sample in self.feed.current():
            seen.add(sample.node)
            if not fresh_holders and frames.sources.get(sample.node) is sample:
                continue
            frames.sources[sample.node] = sample
            text = _frame_of(sample, holders, frames.who)
            known = frames.parts.get(sample.node)
            if known is None or known[1] != text:
                frames.parts[sample.node] = (version, text)
        for gone in frames.parts.keys() - seen:  # gone quiet: sent again in full when it speaks
            del frames.parts[gone]
            frames.sources.pop(gone, None)
        frames.holders = holders
        frames.version = version

    def encoded(self, frames: AudienceFrames, sent: int) -> ServerSentEvent:
        """The SSE event of the parts changed since build `sent`."""
        return ServerSentEvent("[" + ",".join(frames.since(sent)) + "]", event="nodes")
