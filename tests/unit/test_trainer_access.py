"""Whether the trainer's uid could read a model folder: mode bits as the kernel applies them (the
owner's bits alone for the owner, the group's for the group, the others' for the rest)."""

from __future__ import annotations

import os

from shared.infra.config import SandboxConfig
from shared.specs.trainer_access import Reader, trainer_reader, unreadable


def model(tmp_path, mode: int = 0o644):
    root = tmp_path / "models"
    folder = root / "m"
    folder.mkdir(parents=True)
    root.chmod(0o755)
    folder.chmod(0o755)
    (folder / "config.json").write_text("{}")
    os.chmod(folder / "config.json", mode)
    return root, folder


def test_owner_group_and_others_bits_as_the_kernel_reads_them(tmp_path):
    root, folder = model(tmp_path, 0o044)  # the owner may not read; everyone else may
    me = os.stat(folder / "config.json")
    owner = Reader(me.st_uid, None, "the owner")
    stranger = Reader(me.st_uid + 12345, None, "a stranger")
    assert "config.json' is not readable by the trainer, which runs as the owner" in unreadable(folder, root, owner)
    assert unreadable(folder, root, stranger) is None
    os.chmod(folder / "config.json", 0o640)
    assert unreadable(folder, root, Reader(None, me.st_gid, "the group")) is None
    assert "-rw-r-----" in unreadable(folder, root, stranger)
    # A folder above the model, inside the root, must let the trainer through; above the root does not matter.
    os.chmod(folder / "config.json", 0o644)
    root.chmod(0o700)
    assert "models' is not searchable" in unreadable(folder, root, stranger)
    root.chmod(0o755)
    tmp_path.chmod(0o700)
    assert unreadable(folder, root, stranger) is None


def test_a_link_is_judged_by_its_target_and_the_folder_that_holds_it(tmp_path):
    root, folder = model(tmp_path)
    blobs = root / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"w")
    os.chmod(blobs / "abc", 0o644)
    (folder / "model.safetensors").symlink_to(blobs / "abc")
    stranger = Reader(os.getuid() + 12345, None, "a stranger")
    blobs.chmod(0o700)
    assert "blobs' is not searchable" in unreadable(folder, root, stranger)
    blobs.chmod(0o755)
    os.chmod(blobs / "abc", 0o600)
    assert "model.safetensors' is not readable" in unreadable(folder, root, stranger)


def test_who_the_trainer_runs_as_in_each_mode():
    assert trainer_reader(SandboxConfig(user="nobody"), "alpha").uid == 65534
    assert trainer_reader(SandboxConfig(user=0, allow_root=True), "alpha") is None  # root reads everything
    team = trainer_reader(SandboxConfig(uid_mode="per_team", team_uids={"alpha": 3001}), "alpha")
    assert (team.uid, team.gid) == (3001, 3001)
    assert trainer_reader(SandboxConfig(uid_mode="per_team", team_uids={}), "alpha") is None
    per_job = trainer_reader(SandboxConfig(uid_mode="per_job"), "alpha")
    assert per_job.uid is None and "every user" in per_job.who
