"""A job as users submit it: ADC fields plus a `train` section of LLaMA-Factory keys.

A bare LLaMA-Factory YAML (no `train` key) is accepted too and wrapped. Every problem is
reported at once, each naming its field, so the API can answer 422 before anything is queued.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.infra.config import AdcConfig, SpecLimits
from shared.specs.spec_bounds import shape_problems
from shared.specs.tenant_paths import TenantRoots
from shared.specs.yaml_input import load_untrusted

NAME_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$"
MAX_DEVICES = 1024  # what a spec may ask for at most; controller.max_job_gpus may lower it
# Keys that mark a document as a bare LLaMA-Factory config rather than an ADC job spec.
_LLAMAFACTORY_MARKERS = {"model_name_or_path", "stage", "finetuning_type", "dataset"}


class JobSpec(BaseModel):
    """What a user asks for. `train` holds LLaMA-Factory keys, checked by the trainer's rules."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN, description="a label for people; need not be unique")
    priority: str | None = Field(None, description="a priority level from the config; default: the lowest")
    gpus: int = Field(1, ge=1, le=MAX_DEVICES, description="devices the job needs, all at once (gang)")
    min_gpus: int | None = Field(
        None, ge=1, le=MAX_DEVICES, description="elastic jobs: fewest devices it may shrink to"
    )
    max_gpus: int | None = Field(None, ge=1, le=MAX_DEVICES, description="elastic jobs: most devices it may grow to")
    preemptible: bool | None = Field(None, description="default: what its priority level says")
    multi_node: bool = Field(False, description="may be spread over several nodes")
    after: str | None = Field(
        None,
        max_length=72,
        description="a job (id or name, of the same team) this one waits for: it starts once that job has "
        "succeeded and is cancelled if it fails",
    )
    serve: bool = Field(
        False,
        description="a serving job: `train` holds LLaMA-Factory's inference keys (model_name_or_path, "
        "adapter_name_or_path, template, generation settings) and the job answers OpenAI-style chat "
        "completions (POST /v1/jobs/{id}/chat/completions) until cancelled",
    )
    train: dict[str, Any] = Field(description="LLaMA-Factory training keys")

    @model_validator(mode="after")
    def _elastic_bounds(self) -> JobSpec:
        if self.min_gpus is not None and self.min_gpus > self.gpus:
            raise ValueError(f"min_gpus ({self.min_gpus}) is larger than gpus ({self.gpus})")
        if self.max_gpus is not None and self.max_gpus < self.gpus:
            raise ValueError(f"max_gpus ({self.max_gpus}) is smaller than gpus ({self.gpus})")
        return self


class SpecError(ValueError):
    """All problems with a submitted spec; each is {"loc": [...], "msg": "..."}."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))


def parse_document(body: bytes | str, content_type: str = "", limits: SpecLimits | None = None) -> Any:
    """Decode a JSON or YAML body (YAML is a superset; JSON is tried first when declared), then bound its
    shape (`shape_problems`) before anything reads its keys. YAML stops parsing at `limits.max_values` nodes."""
    limits = limits or SpecLimits()
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    if "json" in content_type:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpecError(
                [{"loc": ["body"], "msg": f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"}]
            ) from None
    else:
        try:
            doc = load_untrusted(text, max_nodes=limits.max_values)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
            raise SpecError(
                [{"loc": ["body"], "msg": f"not valid YAML{where}: {getattr(err, 'problem', err)}"}]
            ) from None
    if problems := shape_problems(doc, limits):
        raise SpecError(problems)
    return doc


def wrap_bare_llamafactory(doc: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """A bare LLaMA-Factory config becomes an ADC job spec with that config as `train`."""
    if "train" in doc or not (_LLAMAFACTORY_MARKERS & doc.keys()):
        return doc
    derived = name or Path(str(doc.get("output_dir") or "job")).name or "job"
    derived = re.sub(r"[^a-zA-Z0-9._-]", "-", derived)[:63].lstrip("._-") or "job"
    return {"name": derived, "train": doc}


def _pydantic_errors(err: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": list(e["loc"]), "msg": e["msg"]} for e in err.errors()]


def _device_bounds(spec: JobSpec, config: AdcConfig) -> list[dict[str, Any]]:
    """gpus and max_gpus within what the cluster may give one job (quotas are the api's, at admission)."""
    errors = []
    per_node, most = config.controller.max_gpus_per_node, config.controller.max_job_gpus
    for field in ("gpus", "max_gpus", "min_gpus"):
        value = getattr(spec, field)
        if value is not None and value > most:
            errors.append(
                {
                    "loc": [field],
                    "msg": f"{value} devices is more than one job may ask for (controller.max_job_gpus: {most})",
                }
            )
        elif value is not None and field != "min_gpus" and not spec.multi_node and value > per_node:
            errors.append(
                {
                    "loc": [field],
                    "msg": f"{value} devices on one node is more than controller."
                    f"max_gpus_per_node ({per_node}); set multi_node: true to spread it over nodes",
                }
            )
    return errors


def validate_job(
    doc: Any, config: AdcConfig, base_dir: str | Path | None = None, roots: TenantRoots | None = None
) -> tuple[JobSpec, dict[str, Any]]:
    """Check a decoded document; return the spec and its normalized train section. `roots`: the folders
    the submitting team may read (shared/specs/tenant_paths.py), which every path must lie in."""
    from shared.specs.train_spec import SERVE_KEY, TrainSpecError, validate_train_spec

    if not isinstance(doc, dict):
        raise SpecError([{"loc": ["body"], "msg": f"expected a mapping, got {type(doc).__name__}"}])
    limits = config.api.spec_limits
    if problems := shape_problems(doc, limits):  # cheap, and first: what follows costs per key
        raise SpecError(problems)
    doc = wrap_bare_llamafactory(doc)
    errors: list[dict[str, Any]] = []
    spec = None
    try:
        spec = JobSpec.model_validate(doc)
    except ValidationError as err:
        errors += _pydantic_errors(err)
    levels = [lv.name for lv in config.strategies.priority_scheduling.levels]
    priority = doc.get("priority")
    if priority is not None and priority not in levels:
        errors.append({"loc": ["priority"], "msg": f"unknown priority level {priority!r}; levels are {levels}"})
    if spec is not None:
        errors += _device_bounds(spec, config)
    train: dict[str, Any] = {}
    if isinstance(doc.get("train"), dict):
        asked = dict(doc["train"])
        if SERVE_KEY in asked:  # ADC's own key, set from `serve`
            errors.append({"loc": ["train", SERVE_KEY], "msg": "set by ADC; write `serve: true` beside `train`"})
            asked.pop(SERVE_KEY)
        if doc.get("serve") is True:
            asked[SERVE_KEY] = True
        try:
            train = validate_train_spec(asked, base_dir=base_dir, roots=roots, limits=limits)
        except TrainSpecError as err:
            errors += err.errors
    if errors or spec is None:
        raise SpecError(errors)
    return spec, train
