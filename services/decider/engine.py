"""The decider: the cluster view fed from the bus, a pass each `controller.interval` and on
relevant events, decisions out to the executor, everything audited.

Relevant events: a job event that changes the queue (submitted, started, exited, ...) and a new
node wake the regular pass. A watched window predicate becoming true (e.g. a GPU's memory has
now been above the threshold for `for_s`) wakes the urgent pass instead: its own task, which runs
at once only the rules watching that window, beside the regular pass rather than after it (or
after the gap between passes), so an OOM decision goes out within a sample of the window being
satisfied. Both passes decide through the same arbitration, cooldowns, rate limit, decisions in
flight and fencing token (arbitration is synchronous: one pass's decisions are in flight before
the other arbitrates; devices they book count as taken for both), and both audit every decision.

Rules and adc_config.yaml are hot reloaded: checked every `decider.reload_interval`, validated,
swapped atomically; failures keep the previous version and are audited with the file and the
error.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
from nats.aio.msg import Msg

from services.decider.cluster_view import ClusterView, Watch
from services.decider.evaluation import EngineCore, Incident, PassResult
from services.decider.live_config import ConfigChange, LiveConfig
from shared.pending_reasons import PendingReasonBoard
from services.decider.plugin import Rule
from services.decider.rule_loader import ReloadEvent, RuleRegistry
from services.decider.rule_runner import RuleRunner
from services.decider.snapshot import Snapshot
from services.decider.snapshot_source import SnapshotSource
from services.decider.telemetry import TelemetryView
from shared import tracing
from shared.bus import Bus
from shared.clock import Clock, SystemClock
from shared.config import DEFAULT_CONFIG_FILE, AdcConfig, Strategies, merge_sections
from shared.strategies import unknown_names
from shared.leases import Instance, Lease, audit_soon
from shared.messages import AuditEvent, Decision, Heartbeat, JobEvent, NodeMetrics
from shared.rejections import rejected

log = logging.getLogger(__name__)
BUILTIN_RULES = Path(__file__).resolve().parent / "rules"
REAUDIT_S = 300.0  # the same rule incident is audited again only after this long
# The bus handlers run one message after another without giving the event loop back while messages
# are queued (nats-py awaits each callback in turn): after this long they let the loop run what is
# ready (a pass's Postgres answers, the urgent pass), so a backlog is not one long stall.
INGEST_SLICE_S = 0.002
FREEZE_EVERY_S = 10.0
URGENT_HOLD_S = 0.2  # the longest the handlers wait for an urgent pass (one waiting on a slow Postgres)
RETRY_WAIT_S = 0.5  # the longest an urgent pass waits for the regular pass to finish a rule it needs


class DeciderEngine:
    def __init__(self, bus: Bus, pool: asyncpg.Pool, config: AdcConfig, clock: Clock | None = None,
                 config_path: str | Path | None = None) -> None:
        self.bus = bus
        self.pool = pool
        self.clock = clock or SystemClock()
        self.live = LiveConfig(Path(config_path or os.environ.get("ADC_CONFIG") or DEFAULT_CONFIG_FILE), config)
        d = config.decider
        self.view = ClusterView(window_s=d.window_s, sample_interval_s=config.collector.interval,
                                max_gap_s=d.max_gap_s, stale_after_s=d.stale_after_s, on_wake=self._window_satisfied)
        self.registry = RuleRegistry(self._rule_folders(config))
        self.core = EngineCore(decision_timeout_s=3 * config.controller.timeout,
                               max_disruptions_per_minute=d.max_disruptions_per_minute)
        self.source = SnapshotSource(pool, self.view, reconcile_s=d.reconcile_s)
        self.board = PendingReasonBoard(bus)
        lease = Instance.this_process()
        self.instance = str(lease)
        self.leadership = Lease(bus, "decider", config.leases.lease_s, lease) if config.leases.enabled else None
        self.last_snapshot: Snapshot | None = None
        self.last_pass: PassResult | None = None
        self.paused: str | None = None  # why the controller was paused at the last pass (None: it was not)
        self._wake = asyncio.Event()
        self._wake_reason = ""
        self._fired = asyncio.Event()  # a watched window was satisfied: the urgent pass runs its rules now
        self._ready = asyncio.Event()  # the first regular pass is over (it reads everything once)
        # Clear while a satisfied window waits for its urgent pass and while that pass runs: the bus
        # handlers hold the next message until then, so the pass has the event loop to itself.
        self._ingest_open = asyncio.Event()
        self._ingest_open.set()
        self._slice_began = time.perf_counter()
        self._policy_lock = asyncio.Lock()  # the two passes apply a new policy or schedule once
        self._next_full = float("-inf")
        self._watch_key: tuple | None = None
        self._watch_rules: dict[Watch, set[str]] = {}  # the rules that asked for each watch
        self._active_schedules: tuple[str, ...] = ()
        self._audited: dict[tuple[str, str, str], float] = {}

    @property
    def config(self) -> AdcConfig:
        return self.live.current

    @staticmethod
    def _rule_folders(config: AdcConfig) -> list[Path]:
        return [BUILTIN_RULES] + ([Path(config.decider.rules_dir)] if config.decider.rules_dir else [])

    # --- serving ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.reload()
        s = self.bus.subjects
        subs = [await self.bus.nc.subscribe(s.heartbeat("*"), cb=self._in_turn(self._on_heartbeat)),
                await self.bus.nc.subscribe(s.metrics("*"), cb=self._in_turn(self._on_metrics)),
                await self.bus.nc.subscribe(s.job_events("*"), cb=self._in_turn(self._on_job_event)),
                await self.bus.nc.subscribe(s.audit, cb=self._in_turn(self._on_audit))]
        self._stop = stop
        tasks = [asyncio.create_task(self._reload_loop(stop)), asyncio.create_task(self._wake_on(stop)),
                 asyncio.create_task(self._urgent_loop(stop))]
        if self.leadership is not None:
            tasks.append(asyncio.create_task(self.leadership.keep(stop, self._leadership_changed)))
        frozen, frozen_at = -1, float("-inf")  # nodes known at the last freeze, and when
        try:
            while not stop.is_set():
                started = self.clock.now()
                self._wake.clear()  # before the pass: an event during it wakes the next one
                try:
                    if self.leadership is None or self.leadership.is_leader:
                        await self.tick()
                        self._ready.set()
                except Exception:  # a failed pass is retried by the next one
                    log.exception("evaluation failed")
                self._next_full = started + self.config.controller.interval
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
                gap = self.config.decider.min_tick_gap_s - (self.clock.now() - started)
                if gap > 0 and not stop.is_set():
                    await self.clock.wait(stop, gap)  # let a burst of events collapse into one pass
        finally:
            for task in tasks:  # the lease's own task releases it as it ends
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sub in subs:
                await sub.unsubscribe()

    async def _wait(self, stop: asyncio.Event, timeout: float) -> None:
        """Until the next pass is due: `timeout` passed or something woke the engine (stop does too)."""
        if not stop.is_set():
            await self.clock.wait(self._wake, timeout)

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()
        self._fired.set()

    async def _urgent_loop(self, stop: asyncio.Event) -> None:
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
                        self._ingest_open.set()
        finally:
            self._ingest_open.set()

    async def _urgent_pass(self, stop: asyncio.Event, retries: int) -> int:
        """One turn of the urgent loop: the rules watching the windows satisfied since the last turn
        run now; returns how many times in a row they could not (a rule the regular pass was running)."""
        if not self._ready.is_set():  # the regular pass reads everything first (at start, on leading)
            self._ingest_open.set()
            waits = [asyncio.ensure_future(self._ready.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            return retries
        self._fired.clear()
        fired = self.view.take_fired()
        rules = self._rules_of(fired)
        if not rules or not (self.leadership is None or self.leadership.is_leader):
            return retries  # a follower decides nothing
        try:
            result = await self.tick(rules)
        except Exception:  # the regular pass runs these rules too
            log.exception("urgent evaluation failed")
            return retries
        if self.paused:
            return 0  # no rule ran, and none is due again: the first pass after a resume runs them all
        # A rule the regular pass is running just then is not started twice (rule_runner): its
        # windows are taken up again shortly, so a satisfied window is not dropped.
        failed = {i.rule for i in result.incidents}
        missed = {n for n in rules if n not in result.timings_ms and n not in failed}
        if missed and retries < 200:
            self.view.fire_again({w for w in fired if self._watch_rules.get(w, set()) & missed})
            self._ingest_open.set()  # the wait is for the regular pass: ingest goes on meanwhile
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

    async def _leadership_changed(self, leading: bool) -> None:
        asyncio.ensure_future(audit_soon(self.bus, self.leadership.audit_event(leading), self._stop))
        log.warning("decider %s %s (token %s)", self.instance, "leads" if leading else "follows",
                    self.leadership.last_token)
        if leading:
            self._ready.clear()  # no urgent pass before a regular one has read everything again
            self.core.in_flight.clear()  # whatever this instance expected before is stale now
            self.source.book.expire()    # and its view of the tables is read whole before it decides
            self.source.tables_changed(self.clock.now())
            self._woken("leading")

    def _woken(self, reason: str) -> None:
        """Run a regular pass soon."""
        self._wake_reason = reason
        self._wake.set()

    def _window_satisfied(self, reason: str) -> None:
        self._wake_reason = reason
        self._fired.set()
        if self._ready.is_set():  # (before the first regular pass the urgent loop only waits for it)
            self._ingest_open.clear()  # the urgent pass runs before the next message is taken

    def _in_turn(self, handler: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        async def in_turn(msg: Msg) -> None:
            await self._take_turn()
            await handler(msg)
        return in_turn

    async def _take_turn(self) -> None:
        """Before each message a bus handler takes: wait while an urgent pass is due or under way,
        and give the event loop back after INGEST_SLICE_S of handling messages in a row."""
        if not self._ingest_open.is_set():
            if not await self.clock.wait(self._ingest_open, URGENT_HOLD_S):
                self._ingest_open.set()  # a pass this slow does not hold up ingest: it goes on beside it
            self._slice_began = time.perf_counter()
        elif time.perf_counter() - self._slice_began >= INGEST_SLICE_S:
            await asyncio.sleep(0)
            self._slice_began = time.perf_counter()

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = Heartbeat.decode(msg.data)
        except ValueError as err:
            rejected("heartbeats", err, msg.data, "decider")
            return
        if beat.node != self.bus.subjects.node_of(msg.subject):  # a node speaking for another: forged
            return
        if self.view.heartbeat(beat, self.clock.now()):
            self._woken(f"node {beat.node} registered or changed")

    async def _on_metrics(self, msg: Msg) -> None:
        try:
            sample = NodeMetrics.decode(msg.data)
            if sample.node == self.bus.subjects.node_of(msg.subject):  # else one node's collector forging another's
                self.view.ingest(sample)
        except ValueError as err:
            rejected("metrics", err, msg.data, "decider")

    async def _on_job_event(self, msg: Msg) -> None:
        try:
            event = JobEvent.decode(msg.data)
        except ValueError as err:
            rejected("job_events", err, msg.data, "decider")
            return
        book = self.source.book
        if event.kind == "progress":  # progress wakes nothing; it may carry comm latency
            book.progress(event.job_id, event.attempt, event.node, event.data)
            if "comm_latency_us_by_node" in event.data:
                try:
                    self.view.job_comm_latency(event.job_id, event.ts, event.data["comm_latency_us_by_node"])
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
            return
        if event.kind == "checkpointed":
            self.view.job_checkpointed(event.job_id, event.ts)
            book.checkpointed(event.job_id)
            return
        book.changed(event.job_id)
        self._woken("job event")

    async def _on_audit(self, msg: Msg) -> None:
        # Wake-ups, and which jobs to re-read: the executor audits every transition after committing
        # it, the api every submission and request. Policy and pause: each pass reads the tables.
        if b'"kind":"job.' in msg.data:
            try:
                event = AuditEvent.decode(msg.data)
            except ValueError as err:
                rejected("audit", err, msg.data, "decider")
                return
            if event.job_id:
                self.source.book.changed(event.job_id)
                self._woken(f"{event.kind} {event.job_id}")
            if event.kind == "job.move_requested":
                self.source.tables_changed(self.clock.now())
        elif b'"kind":"node.' in msg.data or b'"kind":"quota.' in msg.data:
            self.source.tables_changed(self.clock.now())
            self._woken("node or quota change")
        elif b'"kind":"policy.' in msg.data or b'"kind":"controller.' in msg.data:
            self.source.controller_changed(self.clock.now())
            self._woken("policy or controller change")

    # --- a pass ----------------------------------------------------------------------

    def _rules_of(self, watches: set[Watch]) -> dict[str, Rule]:
        names = set().union(*(self._watch_rules.get(w, ()) for w in watches))
        return {n: r for n, r in self.registry.rules.items() if n in names}

    async def tick(self, only: dict[str, Rule] | None = None) -> PassResult:
        """One pass: every rule, or `only` these (the rules whose watched window was just satisfied:
        arbitration, cooldowns, the limiter and the decisions in flight apply as in any pass; the
        pending reasons, which come from all rules, are left as the last full pass wrote them).

        An urgent pass (`only`) asks Postgres what it asks at once (controller state, the jobs events
        named, decisions in flight), and leaves the periodic reconcile of the job view to the regular
        pass: its cost does not grow with the cluster beyond building the snapshot."""
        now = self.clock.now()
        flying = [f.decision_id for f in self.core.in_flight.values()]
        if only is None:
            version, paused = await self.source.controller_state(now)
            config, active = await self._config_at(now, version)
            jobs = await self.source.jobs(config, now)
            states = await self.source.decision_states(flying)
        else:
            guess, _ = self.live.scheduled.at(now)
            state = self.source.recent_controller_state(now, self.config.controller.interval)
            if state is None or flying:
                reads = [self.source.jobs(guess, now, whole=False), self.source.decision_states(flying)]
                if state is None:
                    reads.append(self.source.controller_state(now))
                jobs, states, *read = await asyncio.gather(*reads)
                state = read[0] if read else state
            else:  # what events named is read again, if anything; else nothing is asked at all
                jobs, states = await self.source.jobs(guess, now, whole=False), {}
            version, paused = state
            config, active = await self._config_at(now, version)
            if config is not guess:  # a new policy meanwhile: the jobs as its priority levels make them
                jobs = await self.source.jobs(config, now, whole=False)
        live = self.source.book.jobs  # only the jobs of decisions in flight are looked up
        statuses = {j: live[j].status for j in self.core.in_flight if j in live}
        for job_id, why in self.core.resolve(statuses, states, now):
            log.debug("expectation for %s settled: %s", job_id, why)
        snap = await self.source.build(now, config, jobs, self.core.booked(), active)
        self.last_snapshot = snap
        self.paused = paused
        if paused:  # decide nothing; say so to everyone who asks why their job waits
            result = PassResult(snapshot_ts=now, pending={j.id: {"controller": f"{paused}; no new decisions"}
                                                          for j in snap.pending()})
        else:
            result = await self.core.evaluate(snap, self.registry.rules if only is None else only, config)
        await self._publish(result, snap)
        unreadable = await self._report_unreadable(now)
        if only is not None:
            return result
        self.last_pass = result
        self.view.prune(now, config.decider.window_s)
        try:
            await self.board.publish(result.pending | unreadable, {j.id for j in snap.pending()} | unreadable.keys(), now)
        except Exception as err:  # the next pass writes them again
            log.warning("pending reasons not written: %s", err)
        return result

    async def _config_at(self, now: float, version: int) -> tuple[AdcConfig, tuple[str, ...]]:
        """The config in force now: a newer policy applied first (once, whichever pass sees it first:
        versions only grow), schedules noted, watches updated."""
        async with self._policy_lock:
            if version > self.live.policy_version:
                policy = await self.source.latest_policy(self.live.policy_version, version)
                if policy is not None:
                    await self._config_changed(self.live.apply_policy(*policy, self._check_rules))
            config, active = self.live.scheduled.at(now)
            await self._note_schedules(active, now)
        self._update_watches(config)
        return config, active

    async def _publish(self, result: PassResult, snap: Snapshot) -> None:
        if self.leadership is not None:
            # Every decision carries the lease's fencing token; one decided by a leader that has
            # stepped down meanwhile is not sent (the executor would refuse it anyway).
            if (fence := self.leadership.token) is None:
                for unsent in result.decisions:
                    self.core.in_flight.pop(unsent.action.job_id, None)
                log.warning("pass ended after this decider stopped leading; %d decision(s) not sent",
                            len(result.decisions))
                return
            result.decisions[:] = [d.model_copy(update={"fence": fence}) for d in result.decisions]
        for decision in result.shadow:
            await self._audit_decision(decision, snap, result, "decision.shadow")
        for i, decision in enumerate(result.decisions):
            try:
                job_trace = await tracing.job_context(self.pool, decision.action.job_id)
                with tracing.span("decider", f"decide {decision.action.action}", parent=job_trace,
                                  job_id=decision.action.job_id, rule=decision.rule):
                    await self._audit_decision(decision, snap, result, "decision")
                    await self.bus.publish_js(self.bus.subjects.decisions, decision, decision.decision_id)
                self.source.book.changed(decision.action.job_id)  # the executor is about to move it
            except Exception:
                for unsent in result.decisions[i:]:  # not sent: decide them again next pass
                    self.core.in_flight.pop(unsent.action.job_id, None)
                raise
            log.info("decided %s %s by %s: %s", decision.action.action, decision.action.job_id, decision.rule,
                     decision.action.reason)
        for incident in result.incidents:
            await self._audit_incident(incident)
        for verdict in result.refused:
            p = verdict.proposal
            if p.kind == "start" or verdict.routine:
                continue  # the normal course: the same proposal comes back each pass until it can go
            await self._audit_once(AuditEvent(
                ts=result.snapshot_ts, source="decider", kind="decision.held", job_id=p.action.job_id, rule=p.rule,
                action=p.kind, reason=f"{p.action.reason}; held back: {verdict.why}",
                evidence=p.action.evidence, data={"shadow": p.shadow}), (p.rule, p.action.job_id, verdict.why))

    async def _report_unreadable(self, now: float) -> dict[str, dict[str, str]]:
        """Jobs whose row the decider cannot read (job_book.py): audited (again after REAUDIT_S), and a
        pending reason for each pending one, which no rule sees."""
        pending = {}
        for job_id, (status, why) in sorted(self.source.book.unreadable.items()):
            reason = (f"the decider cannot read this job's row ({why}); nothing is decided from it until the row "
                      "is fixed or the job cancelled" + ("; it keeps its devices" if status != "pending" else ""))
            await self._audit_once(AuditEvent(ts=now, source="decider", kind="job.unreadable", job_id=job_id,
                                              reason=reason, data={"status": str(status)}), ("job.unreadable", job_id, why))
            if status == "pending":
                pending[job_id] = {"decider": reason}
        return pending

    async def _audit_decision(self, decision: Decision, snap: Snapshot, result: PassResult, kind: str) -> None:
        a = decision.action
        placement = getattr(a, "placement", None) or []
        job = snap.job(a.job_id)
        node = placement[0].node if placement else (job.placement[0].node if job and job.placement else None)
        suffix = "decided" if kind == "decision" else "shadow"
        await self.bus.audit(AuditEvent(
            event_id=f"{decision.decision_id}:{suffix}", ts=decision.ts, source="decider", kind=kind,
            job_id=a.job_id, node=node, decision_id=decision.decision_id, rule=decision.rule, action=a.action,
            reason=a.reason, evidence=a.evidence,
            data={"snapshot_ts": snap.ts, "rule_ms": result.timings_ms.get(decision.rule), "shadow": decision.shadow,
                  "instance": self.instance,
                  "placement": [p.model_dump() for p in placement], "schedules": list(snap.schedules)},
        ))

    async def _audit_incident(self, incident: Incident) -> None:
        await self._audit_once(AuditEvent(ts=self.clock.now(), source="decider", kind=incident.kind, rule=incident.rule,
                                          reason=incident.reason, data=incident.data),
                               (incident.kind, incident.rule, incident.reason))

    async def _audit_once(self, event: AuditEvent, key: tuple) -> None:
        """Audit, unless the very same thing was audited less than REAUDIT_S ago."""
        now = self.clock.now()
        key = tuple(str(k) for k in key)
        if now - self._audited.get(key, float("-inf")) < REAUDIT_S:
            return
        self._audited[key] = now
        if len(self._audited) > 10_000:
            self._audited = {k: t for k, t in self._audited.items() if now - t < REAUDIT_S}
        await self.bus.audit(event)
        log.warning("%s: %s", event.kind, event.reason)

    async def _note_schedules(self, active: tuple[str, ...], now: float) -> None:
        if active == self._active_schedules:
            return
        for name, kind in [(n, "schedule.started") for n in active if n not in self._active_schedules] + \
                          [(n, "schedule.ended") for n in self._active_schedules if n not in active]:
            await self.bus.audit(AuditEvent(ts=now, source="decider", kind=kind,
                                            reason=f"schedule {name} {kind.split('.')[1]}", data={"schedule": name}))
        self._active_schedules = active

    def _update_watches(self, config: AdcConfig) -> None:
        key = (id(config), id(self.registry.rules))
        if key == self._watch_key:
            return
        watches: list[Watch] = []
        owners: dict[Watch, set[str]] = {}
        for name, rule in self.registry.rules.items():
            if rule.watches is None:
                continue
            try:
                typed = rule.configure(config)
                if typed.enabled:
                    for watch in rule.watches(typed):
                        watches.append(watch)
                        owners.setdefault(watch, set()).add(name)
            except Exception as err:  # noqa: BLE001 - a watch is an optimization; the tick still evaluates
                log.warning("watches of rule %s unavailable: %s", rule.name, err)
        self.view.set_watches(watches)
        self._watch_rules = owners
        self._watch_key = key

    # --- hot reload ------------------------------------------------------------------

    async def _reload_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.clock.wait(stop, self.config.decider.reload_interval)
            if stop.is_set():
                return
            try:
                await self.reload()
            except Exception:  # the next check tries again
                log.exception("reload failed")

    async def reload(self) -> list[ReloadEvent]:
        """Pick up a changed adc_config.yaml and changed rule plugins; audit what happened."""
        await self._config_changed(self.live.check_file(self._check_rules))
        events = await self.registry.scan(self._validate_rule)
        for event in events:
            await self.bus.audit(AuditEvent(ts=self.clock.now(), source="decider", kind=event.kind,
                                            rule=", ".join(event.rules) or None, reason=event.describe(),
                                            data={"file": event.file, "rules": list(event.rules), "error": event.error}))
            log.log(logging.WARNING if event.error else logging.INFO, "%s", event.describe())
        if events:
            self._woken("rules reloaded")
        return events

    def _check_rules(self, config: AdcConfig) -> list[str]:
        """Every loaded rule must bind its section of `config`, with each schedule applied too, and
        every section must belong to a loaded rule (plugin names are known only here)."""
        loaded = self.registry.rules
        problems = unknown_names(config.strategies.model_extra or {}, loaded)
        for i, schedule in enumerate(config.schedules):
            problems += [f"schedules.{i}.{p}" for p in unknown_names(schedule.strategies, loaded)]
        for name, strategies in self._variants(config):
            variant = config.model_copy(update={"strategies": strategies})
            for rule in self.registry.rules.values():
                try:
                    rule.configure(variant)
                except Exception as err:  # noqa: BLE001 - the config's problem, reported
                    problems.append(f"rule {rule.name}{name}: {err}")
        return problems

    @staticmethod
    def _variants(config: AdcConfig) -> list[tuple[str, Strategies]]:
        variants = [("", config.strategies)]
        for schedule in config.schedules:
            merged = merge_sections(config.strategies.model_dump(), schedule.strategies)
            variants.append((f" (schedule {schedule.name})", Strategies.model_validate(merged)))
        return variants

    async def _validate_rule(self, rule: Rule) -> list[str]:
        """A new rule version must bind its config and survive a dry run within its budget."""
        try:
            typed = rule.configure(self.config)
            for _, strategies in self._variants(self.config)[1:]:
                rule.configure(self.config.model_copy(update={"strategies": strategies}))
        except Exception as err:  # noqa: BLE001 - the plugin's problem, reported
            return [f"config: {err}"]
        runner = RuleRunner()
        now = self.clock.now()
        trials = [Snapshot(ts=now, telemetry=TelemetryView.empty(now))]
        if self.last_snapshot is not None:
            trials.append(self.last_snapshot)
        for snap in trials:
            run = await runner.run(rule, snap, typed, typed.budget_ms / 1000.0)
            if run.overrun:
                return [f"dry run took longer than its budget of {typed.budget_ms:g} ms"]
            if run.error:
                return [f"dry run raised {run.error}"]
        return []

    async def _config_changed(self, change: ConfigChange | None) -> None:
        if change is None:
            return
        await self.bus.audit(AuditEvent(ts=self.clock.now(), source="decider", kind=change.kind,
                                        reason=change.reason, data=change.data))
        log.log(logging.WARNING if change.failed else logging.INFO, "%s", change.reason)
        if change.failed:
            return
        new = self.config
        self.core.limiter.per_minute = new.decider.max_disruptions_per_minute
        self.core.decision_timeout_s = 3 * new.controller.timeout
        self.view.max_gap_s, self.view.stale_after_s = new.decider.max_gap_s, new.decider.stale_after_s
        self.registry.set_folders(self._rule_folders(new))
        self._watch_key = None
        self._woken("config changed")
