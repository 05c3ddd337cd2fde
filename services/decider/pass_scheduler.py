"""When the decider passes: the regular pass each `controller.interval` and sooner when woken (a
job event that changes the queue, a new node, a reload), at least `decider.min_tick_gap_s` apart
so a burst of events collapses into one pass; and the urgent pass, its own task, which runs at once
only the rules watching a window just satisfied, beside the regular pass rather than after it (or
after the gap between passes), so an OOM decision goes out within a sample of the window being
satisfied. What a pass does is `DecisionPass`'s; both passes go through it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable

from services.decider.cluster_view import ClusterView
from services.decider.core import EngineCore, PassResult
from services.decider.ingest import IngestGate
from services.decider.plugin import Rule
from services.decider.rule_watches import RuleWatches
from shared.infra.clock import Clock
from shared.infra.config import AdcConfig

log = logging.getLogger(__name__)
FREEZE_EVERY_S = 10.0
RETRY_WAIT_S = 0.5  # the longest an urgent pass waits for the regular pass to finish a rule it needs

Tick = Callable[[dict[str, Rule] | None], Awaitable[PassResult]]


class PassScheduler:
    def __init__(
        self,
        clock: Clock,
        config: Callable[[], AdcConfig],
        view: ClusterView,
        core: EngineCore,
        watches: RuleWatches,
        gate: IngestGate,
        tick: Tick,
        leads: Callable[[], bool],
        paused: Callable[[], str | None],
    ) -> None:
        self.clock = clock
        self._config = config  # the config in force, read each turn (reloads replace it)
        self.view = view
        self.core = core
        self.watches = watches
        self.gate = gate
        self._tick = tick
        self._leads = leads  # whether this instance decides (a follower does not)
        self._paused = paused  # why the controller was paused at the last pass (None: it was not)
        self._wake = asyncio.Event()
        self.wake_reason = ""
        self._fired = asyncio.Event()  # a watched window was satisfied: the urgent pass runs its rules now
        self.ready = asyncio.Event()  # the first regular pass is over (it reads everything once)
        self._next_full = float("-inf")

    # --- wakes -----------------------------------------------------------------------

    def woken(self, reason: str) -> None:
        """Run a regular pass soon."""
        self.wake_reason = reason
        self._wake.set()

    def window_satisfied(self, reason: str) -> None:
        self.wake_reason = reason
        self._fired.set()
        if self.ready.is_set():  # (before the first regular pass the urgent loop only waits for it)
            self.gate.hold()  # the urgent pass runs before the next message is taken

    async def wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()
        self._fired.set()

    # --- the regular pass ------------------------------------------------------------

    async def regular_loop(self, stop: asyncio.Event) -> None:
        frozen, frozen_at = -1, float("-inf")  # nodes known at the last freeze, and when
        while not stop.is_set():
            started = self.clock.now()
            self._wake.clear()  # before the pass: an event during it wakes the next one
            try:
                if self._leads():
                    await self._tick(None)
                    self.ready.set()
            except Exception:  # a failed pass is retried by the next one
                log.exception("evaluation failed")
            self._next_full = started + self._config().controller.interval
            if len(self.view.nodes) > frozen and self.clock.now() - frozen_at >= FREEZE_EVERY_S:
                frozen, frozen_at = len(self.view.nodes), self.clock.now()
                # What the decider loaded to start (modules, schemas, rules, its first view) and the
                # cluster's inventory (each node's heartbeat, devices, rows) live as long as it does:
                # kept out of the collector's full passes, which otherwise walk it all and stall a
                # pass (and an urgent pass beside it) for tens to hundreds of milliseconds at 1,000
                # nodes. After the first pass and after one that found new nodes, at most every
                # FREEZE_EVERY_S (the full collection before it stalls the loop too: not once a
                # pass while a thousand nodes register).
                gc.collect()
                gc.freeze()
            await self._wait(stop, max(0.0, self._next_full - self.clock.now()))
            gap = self._config().decider.min_tick_gap_s - (self.clock.now() - started)
            if gap > 0 and not stop.is_set():
                await self.clock.wait(stop, gap)  # let a burst of events collapse into one pass

    async def _wait(self, stop: asyncio.Event, timeout: float) -> None:
        """Until the next pass is due: `timeout` passed or something woke the engine (stop does too)."""
        if not stop.is_set():
            await self.clock.wait(self._wake, timeout)

    # --- the urgent pass -------------------------------------------------------------

    async def urgent_loop(self, stop: asyncio.Event) -> None:
        """The urgent pass: as soon as a watched window is satisfied, the rules watching it run on a
        fresh snapshot, whatever the regular pass is doing (its gap, or a pass under way)."""
        retries = 0
        try:
            while not stop.is_set():
                await self._fired.wait()
                if stop.is_set():
                    return
                try:
                    retries = await self._urgent_pass(stop, retries)
                finally:
                    if not self._fired.is_set():  # else the next turn runs at once, before ingest goes on
                        self.gate.release()
        finally:
            self.gate.release()

    async def _urgent_pass(self, stop: asyncio.Event, retries: int) -> int:
        """One turn of the urgent loop: the rules watching the windows satisfied since the last turn
        run now; returns how many times in a row they could not (a rule the regular pass was running)."""
        if not self.ready.is_set():  # the regular pass reads everything first (at start, on leading)
            self.gate.release()
            waits = [asyncio.ensure_future(self.ready.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            return retries
        self._fired.clear()
        fired = self.view.take_fired()
        rules = self.watches.rules_of(fired)
        if not rules or not self._leads():
            return retries  # a follower decides nothing
        try:
            result = await self._tick(rules)
        except Exception:  # the regular pass runs these rules too
            log.exception("urgent evaluation failed")
            return retries
        if self._paused():
            return 0  # no rule ran, and none is due again: the first pass after a resume runs them all
        # A rule the regular pass is running just then is not started twice (rule_runner): its
        # windows are taken up again shortly, so a satisfied window is not dropped.
        failed = {i.rule for i in result.incidents}
        missed = {n for n in rules if n not in result.timings_ms and n not in failed}
        if missed and retries < 200:
            self.view.fire_again({w for w in fired if self.watches.owners.get(w, set()) & missed})
            self.gate.release()  # the wait is for the regular pass: ingest goes on meanwhile
            # Until the regular pass is done with those rules (polled: a whole urgent pass each 2 ms
            # instead would compete with that very pass for the loop and the GIL), at most RETRY_WAIT_S.
            waited = 0.0
            while waited < RETRY_WAIT_S and any(self.core.runner.busy_since(n) is not None for n in missed):
                await asyncio.sleep(0.002)
                waited += 0.002
            await asyncio.sleep(0.002)
            self._fired.set()
            return retries + 1
        return 0
