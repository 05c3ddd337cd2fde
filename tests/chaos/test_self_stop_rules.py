"""The two rules a cut-off worker's self-stop rests on, deterministically (no trainer, seconds):

- a worker whose bus connection goes silent (a black-holed relay to the real, authorized NATS)
  asks its trainers to checkpoint-stop once half of worker.node_timeout has passed without a
  round trip (on the manual clock), not before, and is no longer cut off once the relay heals;
- the worker starting the next attempt resumes from the job's newest complete checkpoint when
  it is newer than the one the executor named (the cut-off attempt's, which nobody heard of).
The whole story with real trainers is `test_cut_off_worker.py`.
"""

from __future__ import annotations

import asyncio
import json
import time

from shared.infra.bus import Bus
from shared.infra.clock import ManualClock
from tests.chaos.partition import Partition
from tests.conftest import Isolated
from worker.agent import NodeAgent
from worker.inventory import cpu_slots
from worker.trainer.checkpoints import MANIFEST_NAME
from worker.trainer_process import JobFolder, TrainerProcess

NODE = "node-cut"
NODE_TIMEOUT_S = 6.0


async def test_a_silent_bus_stops_the_trainers_at_half_the_node_timeout(tmp_path):
    env = await asyncio.to_thread(Isolated((NODE,)).open)
    relay = Partition(lambda: env.nats_url)
    bus = await Bus.connect(relay.url, env.prefix, "worker", env.credential(f"worker-{NODE}"))
    clock = ManualClock()
    agent = NodeAgent(
        bus, NODE, cpu_slots(1), tmp_path, heartbeat_interval=1.0, clock=clock, node_timeout=NODE_TIMEOUT_S
    )
    # A trainer record as the agent keeps one; the stop it is asked for is the file the trainer polls.
    trainer = TrainerProcess("job-cut", 1, [0], JobFolder(tmp_path / "jobs" / "job-cut"))
    trainer.folder.stop_file(1).parent.mkdir(parents=True)
    agent.trainers["job-cut"] = trainer
    try:
        await agent.check_cut_off()
        assert not agent.cut_off and agent.last_contact == clock.now()

        relay.cut()
        clock.advance(NODE_TIMEOUT_S / 2 - 0.1)
        await agent.check_cut_off()  # the round trip times out, but not long enough yet
        assert bus.nc.is_connected and not agent.cut_off
        assert not trainer.folder.stop_file(1).exists()

        clock.advance(0.2)
        await agent.check_cut_off()
        assert agent.cut_off and trainer.cut_off
        assert trainer.folder.stop_file(1).exists(), "the trainer was not asked to checkpoint-stop"

        relay.heal()  # its connection is reset; the client reconnects through the relay
        deadline = time.monotonic() + 20
        while agent.cut_off:
            assert time.monotonic() < deadline, "still cut off after the relay healed"
            await asyncio.sleep(0.2)
            await agent.check_cut_off()
    finally:
        await bus.close()
        relay.close()
        await asyncio.to_thread(env.close)


def _checkpoint(output, step: int, complete: bool = True):
    path = output / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / MANIFEST_NAME).write_text(json.dumps({"step": step}))
    return str(path)


def test_the_next_attempt_resumes_from_the_newest_complete_checkpoint_of_its_own_job(tmp_path):
    folder = JobFolder(tmp_path / "jobs" / "j1")
    assert folder.resume_point(None) is None
    reported = _checkpoint(folder.output_dir, 10)
    assert folder.resume_point(reported) == reported
    self_stopped = _checkpoint(folder.output_dir, 13)  # written while cut off: never reported
    _checkpoint(folder.output_dir, 15, complete=False)  # still being written: not a resume point
    assert folder.resume_point(reported) == self_stopped
    assert folder.resume_point(None) == self_stopped
    assert folder.resume_point(self_stopped) == self_stopped
    other = _checkpoint(tmp_path / "jobs" / "j0" / "output", 40)  # a spec resuming from another job's
    assert folder.resume_point(other) == other
