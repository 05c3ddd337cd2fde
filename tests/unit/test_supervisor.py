"""The restart policy of `adc up`: back off 1, 2, 4 ... s while a service keeps dying, log and
count each restart, and start the backoff over once it has stayed up."""

from pathlib import Path

from cli.supervisor import Supervisor


class Proc:
    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self):
        return self.returncode


class Stack:
    logs = Path("/logs")

    def __init__(self) -> None:
        self.procs = {"executor": Proc(100)}
        self.started = 0

    def restart(self, name: str) -> None:
        self.started += 1
        self.procs[name] = Proc(100 + self.started)


def crash(stack: Stack, code: int = -9) -> None:
    stack.procs["executor"].returncode = code


def test_backoff_doubles_while_a_service_keeps_dying_and_resets_once_it_stays_up():
    stack, lines = Stack(), []
    sup = Supervisor(stack, log=lines.append, max_backoff_s=4, healthy_after_s=60)
    waits = []
    now = 0.0
    for _ in range(4):
        crash(stack)
        sup.tick(now)
        waits.append(sup.restarts["executor"].backoff_s)
        sup.tick(now + waits[-1] - 0.1)
        assert stack.started == len(waits) - 1  # not before its time
        now += waits[-1]
        sup.tick(now)
        assert stack.started == len(waits)
    assert waits == [1, 2, 4, 4]
    assert lines[0] == "executor exited with code -9; restart #1 in 1 s (log: /logs/executor.log)"
    assert lines[1] == "executor restarted (restart #1), pid 101"
    assert sup.restarts["executor"].count == 4
    sup.tick(now + 60)  # up for a minute: healthy again
    crash(stack, 1)
    sup.tick(now + 61)
    assert sup.restarts["executor"].backoff_s == 1 and "code 1; restart #5 in 1 s" in lines[-1]
