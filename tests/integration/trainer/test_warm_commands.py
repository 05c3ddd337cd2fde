"""The worker's side of a warm move, short of a trainer: what a `go` may name, and what it refuses."""

from __future__ import annotations

import json

from shared.contracts.messages import Command, CommandError, Device
from worker.agent import NodeAgent
from worker.trainer_process import JobFolder, TrainerProcess


def agent_with_prepared(tmp_path) -> tuple[NodeAgent, TrainerProcess]:
    agent = NodeAgent(None, "n1", [Device(index=0, kind="cpu"), Device(index=1, kind="cpu")], tmp_path)
    folder = JobFolder(tmp_path / "jobs" / "j1")
    (folder.root / "attempt-2").mkdir(parents=True)
    folder.output_dir.mkdir()
    prepared = TrainerProcess("j1", 2, [1], folder, warm=True)
    agent.prepared["j1"] = prepared
    return agent, prepared


def go(checkpoint: str | None, attempt: int = 2) -> Command:
    return Command(kind="go", job_id="j1", attempt=attempt, resume_from=checkpoint, team="t")


async def test_a_go_naming_another_jobs_checkpoint_is_refused_and_nothing_is_written(tmp_path):
    agent, prepared = agent_with_prepared(tmp_path)
    other = tmp_path / "jobs" / "j2" / "output" / "checkpoint-4"
    other.mkdir(parents=True)
    result = await agent.go(go(str(other)))
    assert not result.ok and result.error == CommandError.REFUSED and "not a checkpoint of this job" in result.message
    # A symlink the trainer planted in its own output, pointing elsewhere, is judged by where it leads.
    (prepared.folder.output_dir / "checkpoint-9").symlink_to(other)
    result = await agent.go(go(str(prepared.folder.output_dir / "checkpoint-9")))
    assert not result.ok and result.error == CommandError.REFUSED
    assert not prepared.folder.go_file(2).exists() and not prepared.folder.fence.exists()
    assert agent.prepared["j1"] is prepared and "j1" not in agent.trainers


async def test_a_go_for_an_attempt_not_prepared_here_is_refused(tmp_path):
    agent, _ = agent_with_prepared(tmp_path)
    result = await agent.go(go(None, attempt=3))
    assert not result.ok and result.error == CommandError.NOT_RUNNING


async def test_a_go_raises_the_fence_and_writes_the_checkpoint_for_the_trainer(tmp_path):
    agent, prepared = agent_with_prepared(tmp_path)
    agent.registry.mkdir(parents=True)
    checkpoint = prepared.folder.output_dir / "checkpoint-4"
    checkpoint.mkdir()
    result = await agent.go(go(str(checkpoint)))
    assert result.ok, result
    assert json.loads(prepared.folder.go_file(2).read_text()) == {"resume_from": str(checkpoint)}
    assert prepared.folder.fence.read_text().strip().endswith("2")
    assert agent.trainers["j1"] is prepared and "j1" not in agent.prepared and not prepared.warm
    assert (await agent.go(go(str(checkpoint)))).ok  # a repeated go is done already
