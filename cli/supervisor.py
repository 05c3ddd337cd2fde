"""What `adc up` adds to a started Stack: it restarts a service that dies, with backoff, and
stops everything on SIGINT, SIGTERM or SIGHUP, as systemd or Docker would.

A restart is logged with the exit code and counted; a service that keeps dying waits longer
each time (1 s, 2 s, 4 s ... up to `max_backoff_s`), and the wait starts over once it has
stayed up for `healthy_after_s`.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cli.stack import Stack

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class _Restarts:
    count: int = 0
    backoff_s: float = 0.0
    due: float | None = None
    up_since: float = field(default_factory=time.monotonic)


class Supervisor:
    def __init__(
        self,
        stack: Stack,
        log: Callable[[str], None] | None = None,
        max_backoff_s: float = 30.0,
        healthy_after_s: float = 60.0,
    ) -> None:
        self.stack = stack
        self.log = log or (lambda line: print(f"adc: {line}", file=sys.stderr, flush=True))
        self.max_backoff_s = max_backoff_s
        self.healthy_after_s = healthy_after_s
        self.restarts: dict[str, _Restarts] = {name: _Restarts() for name in stack.procs}
        self.stop_requested = threading.Event()
        self.stop_signal: int | None = None

    def handle_stop_signals(self) -> None:
        # Set explicitly: a shell that starts `adc up &` leaves SIGINT ignored, and Python keeps that.
        def stop(signum, _frame) -> None:
            self.stop_signal = signum
            self.stop_requested.set()

        for sig in STOP_SIGNALS:
            signal.signal(sig, stop)

    def run(self, tick_s: float = 0.5) -> None:
        while not self.stop_requested.wait(tick_s):
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        for name, proc in self.stack.procs.items():
            state = self.restarts.setdefault(name, _Restarts(up_since=now))
            if proc.poll() is None:
                if state.backoff_s and now - state.up_since >= self.healthy_after_s:
                    state.backoff_s = 0.0
                continue
            if state.due is None:
                state.backoff_s = min(self.max_backoff_s, max(1.0, 2 * state.backoff_s))
                state.due = now + state.backoff_s
                self.log(
                    f"{name} exited with code {proc.returncode}; restart #{state.count + 1} in {state.backoff_s:.0f} s"
                    f" (log: {self.stack.logs / (name + '.log')})"
                )
            elif now >= state.due:
                self.stack.restart(name)
                state.count += 1
                state.due = None
                state.up_since = now
                self.log(f"{name} restarted (restart #{state.count}), pid {self.stack.procs[name].pid}")
