"""Job references: a train key naming an earlier job's output, and `after`, the job a job waits for.

`adapter_name_or_path: job://sft-run` (or `job://j0123456789abcdef/checkpoint-500`) names the
output folder of the newest job of that name (or that id) of the submitter's team; the same for
`model_name_or_path`, `ref_model`, `reward_model` and the adapter lists. The api resolves each to
the folder in the storage root (`jobs/<id>/output[/<path>]`) and grants this job, and only this
job, that folder to read (`TenantRoots.granted`); the worker checks the folder's team again and
binds it read-only into the trainer's sandbox (worker/launch_check.py). A reference is refused
(422, naming the key) when no job of the team has that id or name (another team's job reads the
same), when the path inside it is not a plain relative path, and when the job has not succeeded
and this job does not wait for it (`after`, or an earlier job of the same chain).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from shared.contracts.job_status import JobStatus
from shared.infra.job_reads import team_jobs
from shared.specs.tenant_paths import TenantRoots, safe_component

PREFIX = "job://"
KEYS = (
    "model_name_or_path",
    "ref_model",
    "reward_model",
    "adapter_name_or_path",
    "ref_model_adapters",
    "reward_model_adapters",
)
LISTS = {"adapter_name_or_path", "ref_model_adapters", "reward_model_adapters"}  # comma-separated
MAX_DEPTH = 8  # parts of the path inside a job's output folder
_ENDED = {JobStatus.FAILED.value, JobStatus.CANCELLED.value}


Target = team_jobs.NamedJob  # a job a reference names: its id, name and status


@dataclass
class Resolved:
    """A spec's references resolved: its train section with folders for references, the folders granted,
    the job it waits for, and what each key named (for the audit)."""

    doc: dict[str, Any]
    roots: TenantRoots
    after: str | None = None
    inputs: dict[str, str] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)


def _error(errors: list, loc: list, msg: str) -> None:
    errors.append({"loc": loc, "msg": msg})


def split(ref: str) -> tuple[str, tuple[str, ...]] | str:
    """(job id or name, path parts inside its output folder), or why the reference is malformed."""
    rest = ref[len(PREFIX) :]
    target, _, inside = rest.partition("/")
    parts = tuple(inside.split("/")) if inside else ()
    if not target or not safe_component(target):
        return f"{ref!r}: name a job by its id or name, e.g. job://my-sft or job://my-sft/checkpoint-100"
    if len(parts) > MAX_DEPTH or any(not safe_component(p) for p in parts):
        return f"{ref!r}: the path inside the job's output folder must be plain names (no '..', '.', '//', '~')"
    return target, parts


class Lookup:
    """Jobs of one team by id or name, with the jobs of this submission's chain (not stored yet) first."""

    def __init__(self, conn: asyncpg.Connection, team: str, chain: dict[str, str] | None = None) -> None:
        self.conn = conn
        self.team = team
        self.chain = chain or {}  # name or id -> id of an earlier spec of this chain
        self._found: dict[str, Target | None] = {}

    async def find(self, key: str) -> Target | None:
        if key in self.chain:
            return Target(self.chain[key], key, JobStatus.PENDING.value)
        if key not in self._found:
            self._found[key] = await team_jobs.by_id_or_name(self.conn, self.team, key)
        return self._found[key]

    def unknown(self, key: str) -> str:
        # The same words whether the job is another team's or does not exist.
        return f"no job of team {self.team!r} has the id or name {key!r}"


async def resolve(doc: dict[str, Any], roots: TenantRoots, lookup: Lookup, chain_after: dict | None = None) -> Resolved:
    """Resolve `after` and every `job://` of the spec's train section. `chain_after`: the job each earlier
    job of this chain waits for, so that this one waits for all of them that its `after` waits for."""
    out = Resolved(doc=doc, roots=roots)
    after = doc.get("after")
    if isinstance(after, str) and after:
        target = await lookup.find(after.removeprefix(PREFIX))
        if target is None:
            _error(out.errors, ["after"], lookup.unknown(after))
        elif target.status in _ENDED:
            _error(out.errors, ["after"], f"job {target.id} ({target.name}) is {target.status}: nothing runs after it")
        else:
            out.after = target.id
    waits, at = set(), out.after
    while at and at not in waits:
        waits.add(at)
        at = (chain_after or {}).get(at)
    train = doc.get("train")
    if not isinstance(train, dict):
        return out
    train = dict(train)
    granted: list[Path] = []
    awaited: list[Path] = []
    for key in KEYS:
        value = train.get(key)
        if not isinstance(value, str) or PREFIX not in value:
            continue
        parts = [p.strip() for p in value.split(",")] if key in LISTS else [value.strip()]
        for i, part in enumerate(parts):
            if not part.startswith(PREFIX):
                continue
            folder = await _folder(part, key, lookup, roots, waits, out)
            if folder is not None:
                job_id, path, final = folder
                (granted if final else awaited).append(roots.job_output(job_id))
                parts[i] = str(path)
        train[key] = ",".join(parts)
    out.doc = {**doc, "train": train}
    out.roots = roots.with_granted([*granted, *awaited], awaited) if granted or awaited else roots
    if out.after is not None:
        out.doc["after"] = out.after
    return out


async def _folder(
    ref: str, key: str, lookup: Lookup, roots: TenantRoots, waits: set[str], out: Resolved
) -> tuple[str, Path, bool] | None:
    """(job id, folder, whether that job has succeeded) a reference names, or None with the error recorded."""
    loc = ["train", key]
    parsed = split(ref)
    if isinstance(parsed, str):
        _error(out.errors, loc, parsed)
        return None
    name, parts = parsed
    target = await lookup.find(name)
    output = roots.job_output(target.id) if target else None
    if target is None or output is None:
        _error(out.errors, loc, f"{ref!r}: {lookup.unknown(name)}")
        return None
    folder = output.joinpath(*parts)
    if target.status != JobStatus.SUCCEEDED.value and target.id not in waits:
        _error(
            out.errors,
            loc,
            f"{ref!r}: job {target.id} ({target.name}) is {target.status}, so its output is not final; "
            f"add `after: {target.id}` to wait until it succeeds",
        )
        return None
    if target.status == JobStatus.SUCCEEDED.value and not os.path.lexists(folder):
        _error(out.errors, loc, f"{ref!r}: job {target.id} ({target.name}) has no {'/'.join(parts) or 'output'}")
        return None
    out.inputs[key] = ref if key not in out.inputs else f"{out.inputs[key]},{ref}"
    return target.id, folder, target.status == JobStatus.SUCCEEDED.value
