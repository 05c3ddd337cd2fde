"""What the worker checks before it launches a trainer, whoever sent the start.

The api checked the spec at submission; the worker checks again, because a command crosses a
boundary and the files may have changed since: every path of the train section inside the
folders the job's team may read (the same rules, shared/specs/tenant_paths.py, through
shared/specs/train_spec.py), a checkpoint to resume from belonging to this job or to another job of
the same team (each job folder notes its team in `team`, written by the worker that first ran
it), for an export job (`adc_export_of`) the source job's output folder of the same team and its
base model inside the team's folders, an earlier job's output that a model key names (`job://` at the
api) of a job of the same team, and only NCCL tuning keys in the command's environment. It then plans the trainer's sandbox
(worker/sandbox.py): its uid, and with bubblewrap the folders it sees.
"""

from __future__ import annotations

from pathlib import Path

from shared.contracts.messages import Command
from shared.infra.config import TenancyConfig
from shared.specs.tenant_paths import CHECKPOINT_KEY, Refused, TenantRoots, path_keys, real, safe_component
from shared.specs.train_spec import TrainSpecError, validate_train_spec
from worker.sandbox import Identity, SandboxError, SandboxPlan, bubblewrap, command_env_problems, trainer_identity
from worker.trainer.interpreter import trainer_python

REPO_ROOT = Path(__file__).resolve().parent.parent


class LaunchRefused(ValueError):
    """The start is refused for good (the executor fails the job with this message)."""


def code_folders() -> tuple[Path, ...]:
    """What a trainer must read to run at all: ADC's trainer package, its environment, that env's Python."""
    python = Path(trainer_python())
    return (REPO_ROOT, real(python.parent.parent), real(python).parent.parent)


class LaunchCheck:
    def __init__(self, tenancy: TenancyConfig, data_root: Path, storage_root: Path) -> None:
        self.tenancy = tenancy
        self.data_root = data_root
        self.storage_root = storage_root

    def roots(self, team: str) -> TenantRoots:
        return TenantRoots.of(self.tenancy, team, self.data_root, self.storage_root)

    def plan(self, cmd: Command) -> SandboxPlan:
        """The sandbox of the command's trainer, or LaunchRefused saying why it may not run."""
        team = cmd.team
        if not team or not safe_component(team):
            raise LaunchRefused(
                f"the start names no valid team ({team!r}); the worker cannot tell which folders the job may read"
            )
        if problems := command_env_problems(cmd.env):
            raise LaunchRefused("env: " + "; ".join(problems))
        roots = self.roots(team)
        train, exported = cmd.train or {}, ()
        if train.get("adc_export_of"):  # an export job (services/api/job_export.py): LLaMA-Factory's export keys
            merged = bool(train.get("adapter_name_or_path"))  # a LoRA adapter, else a full or freeze job's model
            source = train.get("adapter_name_or_path" if merged else "model_name_or_path")
            exported = (self.export_source(roots, train["adc_export_of"], source),)
            try:  # the base model it merges into: inside the team's folders, like any job's
                if merged:
                    roots.confine("model_name_or_path", str(train.get("model_name_or_path") or ""), None)
            except Refused as err:
                raise LaunchRefused(f"train.model_name_or_path: {err}") from None
        else:
            exported = self.job_inputs(cmd.job_id, roots, train)
            try:
                validate_train_spec(train, base_dir=None, roots=roots.with_granted(exported))
            except TrainSpecError as err:
                raise LaunchRefused(str(err)) from None
        resumed = [
            self.checkpoint(cmd.job_id, roots, value)
            for value in (cmd.resume_from, (cmd.train or {}).get(CHECKPOINT_KEY))
            if value
        ]
        sandbox = self.tenancy.sandbox
        try:
            identity = trainer_identity(sandbox, team, cmd.job_id)
        except SandboxError as err:
            raise LaunchRefused(str(err)) from None
        bwrap = bubblewrap() if sandbox.bubblewrap != "off" else None
        if bwrap is None and sandbox.bubblewrap == "required":
            raise LaunchRefused("tenancy.sandbox.bubblewrap is required but bwrap is missing or does not work here")
        readable = (*roots.readable, *code_folders(), *(p.parent for p in resumed), *exported)
        return SandboxPlan(identity=identity, bwrap=bwrap, readable=tuple(readable), hidden=self.hidden())

    def hidden(self) -> tuple[Path, ...]:
        """What every trainer's view empties: the storage root, every team's folders, hidden_paths."""
        every_team = [r for roots_of in self.tenancy.team_roots for r in self.roots(roots_of).own]
        return (self.storage_root, *every_team, *(Path(p) for p in self.tenancy.sandbox.hidden_paths))

    def standby_plan(self, identity: Identity | None) -> SandboxPlan | None:
        """The sandbox of a standby trainer of `identity` (worker/standby.py): a trainer's with no job, so
        only ADC's code readable and nothing writable; None without bubblewrap (a standby needs a mount
        namespace to be handed its job's folders in)."""
        bwrap = bubblewrap() if self.tenancy.sandbox.bubblewrap != "off" else None
        if bwrap is None:
            return None
        return SandboxPlan(identity=identity, bwrap=bwrap, readable=code_folders(), hidden=self.hidden())  # type: ignore[arg-type]

    def export_source(self, roots: TenantRoots, source: str, value: str | None) -> Path:
        """The folder an export job merges: the output of job `source`, which must be of the same team."""
        ok = roots.jobs_root is not None and safe_component(str(source)) and bool(value)
        if ok:
            try:
                ok = (
                    real(value) == real(roots.jobs_root / source / "output")
                    and (roots.jobs_root / source / "team").read_text().strip() == roots.team
                )
            except OSError:
                ok = False
        if not ok:
            raise LaunchRefused(f"train: {value!r} is not the output folder of job {source!r} of team {roots.team!r}")
        return real(value)

    def job_inputs(self, job_id: str, roots: TenantRoots, train: dict) -> tuple[Path, ...]:
        """Output folders of earlier jobs that the train section's models name (`job://` at the api): each of
        another job of the same team, seen read-only by the trainer."""
        found = []
        for key, how in path_keys(k for k in train if isinstance(train.get(k), str)).items():
            if how not in ("model", "models"):
                continue
            for part in train[key].split(",") if how == "models" else [train[key]]:
                owner = roots.output_job(real(part.strip())) if part.strip() else None
                if owner is None:
                    continue
                if owner == job_id or not self._of_team(roots, owner):
                    raise LaunchRefused(
                        f"train.{key}: {part!r} is not the output of another job of team {roots.team!r}"
                    )
                found.append(roots.job_output(owner))
        return tuple(found)

    @staticmethod
    def _of_team(roots: TenantRoots, job_id: str) -> bool:
        try:
            return (roots.jobs_root / job_id / "team").read_text().strip() == roots.team
        except OSError:
            return False

    def checkpoint(self, job_id: str, roots: TenantRoots, value: str) -> Path:
        """A checkpoint this job may resume from: its own, its team's jobs', or in its team's folders."""
        path = real(value)
        if roots.in_own(path):
            return path
        owner_job = roots.checkpoint_job(path)
        if owner_job == job_id:
            return path
        if owner_job is not None and roots.jobs_root is not None:
            try:
                if (roots.jobs_root / owner_job / "team").read_text().strip() == roots.team:
                    return path
            except OSError:
                pass
        raise LaunchRefused(
            f"train.{CHECKPOINT_KEY}: {value!r} is not a checkpoint of this job or of team "
            f"{roots.team!r}'s jobs, nor inside its folders ({roots.describe(roots.own)})"
        )
