"""Checkpoint folders on disk: how they are named, published atomically and found again.

A checkpoint is written into a hidden staging folder (`.staging/checkpoint-N` inside the
output folder) and renamed to `checkpoint-N` only once every rank has finished writing and
the manifest `adc_checkpoint.json` is in place. `rename` within one file system is atomic,
so a reader sees either no `checkpoint-N` or a complete one. The manifest is written last
inside the staging folder and is what marks a checkpoint as ADC-complete; it also records
the batch geometry that a resume at another world size needs.

Importable without torch: the worker uses `latest_complete_checkpoint` to find where to
resume after a crash.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

CHECKPOINT_PREFIX = "checkpoint-"
MANIFEST_NAME = "adc_checkpoint.json"
STAGING_FOLDER = ".staging"
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    match = _CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def staging_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / STAGING_FOLDER


def is_complete(path: str | os.PathLike) -> bool:
    """A published checkpoint: a folder (not a symlink to one: the worker, root, looks here for where to
    resume, and a trainer could point it at another job's) holding its manifest as a regular file."""
    path = Path(path)
    if checkpoint_step(path) is None:
        return False
    try:
        folder, manifest = os.lstat(path), os.lstat(path / MANIFEST_NAME)
    except OSError:
        return False
    return stat.S_ISDIR(folder.st_mode) and stat.S_ISREG(manifest.st_mode)


def read_manifest(path: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / MANIFEST_NAME).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints in `output_dir`, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_complete(p)]
    return sorted(found, key=lambda p: checkpoint_step(p))


def latest_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def _fsync_tree(path: Path) -> None:
    # Data must be on disk before the rename makes the folder visible; otherwise a power
    # loss could leave a visible checkpoint with empty files.
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(staged: Path, manifest: dict[str, Any]) -> None:
    tmp = staged / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, staged / MANIFEST_NAME)


def publish(staged: Path, output_dir: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Make a fully written staging folder visible as `output_dir/checkpoint-N`."""
    output_dir = Path(output_dir)
    write_manifest(staged, manifest)
    _fsync_tree(staged)
    final = output_dir / staged.name
    if final.exists():
        # Same step saved twice (e.g. a rerun over an old folder): move the old one out of
        # the way first; rename cannot replace a non-empty folder.
        retired = staging_root(output_dir) / f"{staged.name}.retired"
        retired.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(final, retired)
        os.replace(staged, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staged, final)
    _fsync_dir(output_dir)
    return final


def prune(output_dir: str | os.PathLike, keep: int | None, protect: set[Path] = frozenset()) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `keep` (save_total_limit)."""
    if not keep or keep <= 0:
        return []
    found = complete_checkpoints(output_dir)
    doomed = [p for p in found[:-keep] if p.resolve() not in {q.resolve() for q in protect}]
    for path in doomed:
        # Rename out of sight first so no reader ever sees a half-deleted checkpoint.
        retired = staging_root(output_dir) / f"{path.name}.retired"
        retired.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(path, retired)
        shutil.rmtree(retired, ignore_errors=True)
    return doomed


def clear_staging(output_dir: str | os.PathLike) -> None:
    """Remove half-written checkpoints left by a killed run."""
    shutil.rmtree(staging_root(output_dir), ignore_errors=True)


# What a checkpoint holds beyond the model files that `save_model` writes at the end of a run.
_TRAINING_STATE = ("optimizer", "scheduler", "rng_state", "scaler", "global_step", MANIFEST_NAME)


def publish_final_model(checkpoint: str | os.PathLike, output_dir: str | os.PathLike, step: int) -> bool:
    """The final model of a run whose last checkpoint is `checkpoint` (at `step`): its model files
    copied into `output_dir`, unless a final model of that step is already there (the finished run's
    own, which is never replaced). True if it copied."""
    output_dir = Path(output_dir)
    try:
        final_step = json.loads((output_dir / "trainer_state.json").read_text()).get("global_step")
    except (FileNotFoundError, json.JSONDecodeError):
        final_step = None
    if final_step is not None and final_step >= step:
        return False
    output_dir.mkdir(parents=True, exist_ok=True)
    # trainer_state.json last: it marks the final model's step, so it appears only after the weights.
    for item in sorted(Path(checkpoint).iterdir(), key=lambda p: p.name == "trainer_state.json"):
        if item.name.startswith(_TRAINING_STATE) or item.is_dir():
            continue
        tmp = output_dir / f".{item.name}.tmp"
        shutil.copy2(item, tmp)
        os.replace(tmp, output_dir / item.name)
    return True
