"""Tenant confinement: the folders a team's job may read, and every path of its `train` section inside them.

An admin declares them under `tenancy` in adc_config.yaml: each team's own folders (`team_roots`),
folders every team may read (`shared_roots`) and the model folders whose own Python may run
(`trusted_code_roots`). A path is resolved with symlinks followed before it is compared, so a
link inside a team's folder to another team's data is refused like the direct path. Outputs go
only to the job's own folder: ADC sets `output_dir`, and the other keys LLaMA-Factory writes to
take a relative path that the worker places inside it. `tokenized_path` is both: LLaMA-Factory loads
the tokenized dataset from it when it exists and writes it there when not, so a relative one is a
write inside the job's folder and an absolute one only a read, of a folder that exists inside the
team's roots (which the sandbox shows read-only). A run resumes only from a checkpoint of
the same job, of another job of the same team, or from the team's own folders.

A refusal names the field and the folders the team may read, and says the same whether or not
the path exists: outside the roots nothing is stat'ed or opened on the caller's behalf beyond
resolving the name. Files read while checking (dataset_info.json, a DeepSpeed config, a model's
config.json) must be regular files under `tenancy.max_file_bytes`, opened without blocking (a
FIFO or /dev/zero is refused, not read).

The api checks at submission (shared/specs/train_spec.py); the worker checks the same rules again
before it launches a trainer (worker/launch_check.py), and the trainer's sandbox shows it only
these folders. Pure Python, no I/O beyond the paths being checked.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shared.infra.config import TenancyConfig
from shared.specs.trainer_access import Reader, trainer_reader, unreadable, within

# How LLaMA-Factory uses a path-valued key, derived from its argument names (every `*_dir`, `*_path`,
# `*_folder`, `*_file`, `*_name_or_path` of the exported schema) plus the keys that take a path
# without saying so in their name. A key of a future LLaMA-Factory that matches is confined as a read.
_PATH_NAME = re.compile(r"(_dir|_path|_folder|_file|_name_or_path|logdir)$")
_WRITTEN = {
    "output_dir",
    "logging_dir",
    "cache_dir",
    "export_dir",
    "profiler_output_dir",
    "offload_folder",
    "swanlab_logdir",
}
_CONFIG_FILES = {"deepspeed", "fsdp_config", "accelerator_config", "new_special_tokens_config"}  # path or inline
_MODELS = {"model_name_or_path", "ref_model", "reward_model"}
_MODEL_LISTS = {"adapter_name_or_path", "ref_model_adapters", "reward_model_adapters"}  # comma-separated
_OTHER_READS = {"export_quantization_dataset"}
_READ_OR_WRITTEN = {"tokenized_path"}  # read if it exists, else written (LLaMA-Factory's data/loader.py)
CHECKPOINT_KEY = "resume_from_checkpoint"
# Files whose `auto_map` makes transformers import Python from the model folder.
_CODE_MARKERS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
_INTERPOLATION = "${"


def path_keys(schema_fields: Iterable[str]) -> dict[str, str]:
    """name -> how it is confined: "read", "write" (relative, inside the job folder), "config" (a file
    read by the trainer, or an inline mapping), "model", "models" (a comma list), "checkpoint",
    "tokenized" (relative: written inside the job folder; absolute: an existing folder, read)."""
    keys: dict[str, str] = {}
    for name in schema_fields:
        if name in _WRITTEN:
            keys[name] = "write"
        elif name in _READ_OR_WRITTEN:
            keys[name] = "tokenized"
        elif name in _CONFIG_FILES:
            keys[name] = "config"
        elif name in _MODELS:
            keys[name] = "model"
        elif name in _MODEL_LISTS:
            keys[name] = "models"
        elif name == CHECKPOINT_KEY:
            keys[name] = "checkpoint"
        elif name in _OTHER_READS or _PATH_NAME.search(name):
            keys[name] = "read"
    return keys


class Refused(ValueError):
    """A path a team may not use; `field` names the key, the message the allowed folders."""

    def __init__(self, field: str, msg: str) -> None:
        super().__init__(msg)
        self.field = field
        self.msg = msg


def real(path: str | os.PathLike) -> Path:
    """The path with `..` and every symlink resolved (the name need not exist)."""
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class TenantRoots:
    """What one team's jobs may read, resolved."""

    team: str
    own: tuple[Path, ...]
    shared: tuple[Path, ...]
    trusted_code: tuple[Path, ...]
    jobs_root: Path | None  # storage.root/jobs: checkpoints of jobs (same team only)
    max_file_bytes: int
    excluded: tuple[Path, ...] = ()  # never readable, even inside a root: storage, sandbox.hidden_paths
    trainer: Reader | None = None  # who the team's trainers run as (shared/specs/trainer_access.py)
    # Output folders of the team's earlier jobs that this job names (`job://`, services/api/job_refs.py):
    # readable by this job only, although they lie in the storage root.
    granted: tuple[Path, ...] = ()
    awaited: tuple[Path, ...] = ()  # those of jobs not finished yet: their contents are checked at launch

    @classmethod
    def of(
        cls,
        tenancy: TenancyConfig,
        team: str,
        data_root: str | os.PathLike,
        storage_root: str | os.PathLike | None = None,
    ) -> TenantRoots:
        base = Path(data_root)

        def resolved(paths: Iterable[str]) -> tuple[Path, ...]:
            return tuple(real(p if Path(p).is_absolute() else base / p) for p in paths)

        storage = (str(storage_root),) if storage_root is not None else ()
        return cls(
            team=team,
            own=resolved(tenancy.team_roots.get(team, [])),
            shared=resolved(tenancy.shared_roots),
            trusted_code=resolved(tenancy.trusted_code_roots),
            jobs_root=real(Path(storage_root) / "jobs") if storage_root is not None else None,
            max_file_bytes=tenancy.max_file_bytes,
            excluded=resolved([*storage, *tenancy.sandbox.hidden_paths]),
            trainer=trainer_reader(tenancy.sandbox, team),
        )

    @property
    def readable(self) -> tuple[Path, ...]:
        return self.own + self.shared

    def unreadable_by_trainer(self, folder: Path) -> str | None:
        """Why the team's trainer could not read model `folder` (resolved, inside a root), or None."""
        roots = [r for r in self.readable if within(folder, (r,))]
        if self.trainer is None or not roots:
            return None
        return unreadable(folder, max(roots, key=lambda r: len(r.parts)), self.trainer)

    def in_own(self, path: Path) -> bool:
        """Inside the team's own folders (and not in storage or a hidden path that happens to lie there)."""
        return within(path, self.own) and not within(path, self.excluded)

    def describe(self, roots: tuple[Path, ...] | None = None) -> str:
        roots = self.readable if roots is None else roots
        if not roots:
            return "none are configured (an admin lists them under tenancy in adc_config.yaml)"
        return ", ".join(str(r) for r in roots)

    def outside(self, field: str, value: str, roots: tuple[Path, ...] | None = None, what: str = "read") -> Refused:
        return Refused(field, f"{value!r} is outside the folders team {self.team!r} may {what}: {self.describe(roots)}")

    def confine(self, field: str, value: str, base_dir: Path | None) -> Path:
        """The resolved path of `value` if it lies inside the team's readable roots; else Refused."""
        path = Path(value)
        if not path.is_absolute():
            if base_dir is None:
                raise self.outside(field, value)
            path = base_dir / path
        resolved = real(path)
        if within(resolved, self.granted):
            return resolved
        if not within(resolved, self.readable) or within(resolved, self.excluded):
            raise self.outside(field, value)
        return resolved

    def with_granted(self, folders: Iterable[Path], awaited: Iterable[Path] = ()) -> TenantRoots:
        """These roots, plus the output folders of earlier jobs this job reads (see `granted`)."""
        return replace(self, granted=tuple(real(f) for f in folders), awaited=tuple(real(f) for f in awaited))

    def job_output(self, job_id: str) -> Path | None:
        """The output folder of job `job_id` in the storage root (it need not exist yet)."""
        if self.jobs_root is None or not safe_component(job_id):
            return None
        return self.jobs_root / job_id / "output"

    def output_job(self, path: Path) -> str | None:
        """The job id whose output folder is or holds `path` (resolved)."""
        if self.jobs_root is None or not path.is_relative_to(self.jobs_root):
            return None
        parts = path.relative_to(self.jobs_root).parts
        return parts[0] if len(parts) >= 2 and parts[1] == "output" and safe_component(parts[0]) else None

    def checkpoint_job(self, path: Path) -> str | None:
        """The job id whose output folder holds `path` (resolved), if it is a job's checkpoint."""
        if self.jobs_root is None or not path.is_relative_to(self.jobs_root):
            return None
        parts = path.relative_to(self.jobs_root).parts
        return parts[0] if len(parts) >= 3 and parts[1] == "output" and safe_component(parts[0]) else None


_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def safe_component(name: str) -> bool:
    """A job id (or team name) usable as one path component: no separators, no `..`, no NUL."""
    return bool(_SAFE_COMPONENT.match(name)) and ".." not in name


def read_small_file(path: Path, field: str, max_bytes: int) -> bytes:
    """A file read during validation: a regular file of at most max_bytes, opened without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise Refused(field, f"{str(path)!r} does not exist") from None
    except OSError as err:
        raise Refused(field, f"{str(path)!r} cannot be read: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(field, f"{str(path)!r} is not a regular file")
        if info.st_size > max_bytes:
            raise Refused(
                field,
                f"{str(path)!r} is {info.st_size} bytes, over the {max_bytes}-byte limit (tenancy.max_file_bytes)",
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            # Its size and one byte more (it may have grown since), not max_bytes: a read allocates what it
            # asks for, 16 MiB by default, twice per submission.
            data = f.read(min(info.st_size, max_bytes) + 1)
            if info.st_size < len(data) <= max_bytes:
                data += f.read(max_bytes + 1 - len(data))
        if len(data) > max_bytes:
            raise Refused(field, f"{str(path)!r} is over the {max_bytes}-byte limit (tenancy.max_file_bytes)")
        return data
    finally:
        os.close(fd)


def read_json_file(path: Path, field: str, max_bytes: int) -> Any:
    try:
        return json.loads(read_small_file(path, field, max_bytes))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise Refused(field, f"{str(path)!r} is not valid JSON: {err}") from None


def custom_code(model_dir: Path, max_bytes: int) -> str | None:
    """The file of a model folder that declares its own Python (`auto_map`), if any."""
    for name in _CODE_MARKERS:
        candidate = model_dir / name
        if not candidate.is_file():
            continue
        try:
            config = read_json_file(candidate, "", max_bytes)
        except Refused:
            continue  # not readable as JSON: transformers fails on it before running anything
        if isinstance(config, dict) and config.get("auto_map"):
            return name
    return None


def interpolations(value: Any, loc: tuple = ()) -> list[tuple]:
    """Locations of strings with `${`: the trainer's config reader (OmegaConf) would resolve them,
    `${oc.env:DATABASE_URL}` included."""
    if isinstance(value, str):
        return [loc] if _INTERPOLATION in value else []
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in interpolations(k, loc) + interpolations(v, (*loc, k))]
    if isinstance(value, (list, tuple)):
        return [hit for i, v in enumerate(value) for hit in interpolations(v, (*loc, i))]
    return []


def placed_in_job_folder(how: str, value: object) -> bool:
    """Whether the worker puts this key's value under the job's output folder (a relative write)."""
    return how in ("write", "tokenized") and isinstance(value, str) and bool(value) and not Path(value).is_absolute()


def relative_inside(field: str, value: str) -> str:
    """A key LLaMA-Factory writes to: a relative path without `..`, placed in the job's folder by the worker."""
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise Refused(
            field,
            f"{value!r}: outputs go inside the job's own folder; give a relative path "
            "(it is placed under the job's output folder)",
        )
    return value
