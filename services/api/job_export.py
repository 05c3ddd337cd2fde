"""`POST /v1/jobs/{id}/export`: LLaMA-Factory's export of a succeeded job, queued as a job of its own.

A worker runs LLaMA-Factory's `export_model` (`llamafactory-cli export`) on the job's output in the
trainer's environment: a LoRA job's adapter is merged into its base model; a full or freeze job's
model is saved again (in `dtype`, in `export_size` GB shards, as safetensors unless
`export_legacy_format`). The result is the export job's output folder, readable by the team.
The same export can be written as an export config in a chain (`adapter_name_or_path: job://NAME`).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Request, status
from pydantic import BaseModel, ConfigDict, Field

from services.api.auth import Principal, authenticate
from services.api.errors import CONFLICT, NOT_FOUND, WITH_BODY, field_errors
from services.api.jobs import JOB_ID, SubmittedJob, _queue_job, visible_job
from services.api.views import job_view
from shared.contracts.job_status import JobStatus
from shared.specs.job_spec import NAME_PATTERN, JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
METHODS = ("lora", "full", "freeze")  # what LLaMA-Factory's export takes a finished job's output from


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype of the exported weights (LLaMA-Factory's infer_dtype); auto: the model's"
    )
    export_size: int = Field(5, ge=1, le=1000, description="largest shard, in GB (LLaMA-Factory's export_size)")
    export_legacy_format: bool = Field(False, description="write .bin (torch pickles) instead of safetensors")
    name: str | None = Field(None, pattern=NAME_PATTERN, description="the export job's name; default: <job>-export")


@router.post(
    "/{job_id}/export",
    status_code=201,
    response_model=SubmittedJob,
    responses=WITH_BODY | NOT_FOUND | CONFLICT,
    summary="Export a succeeded job's model (LLaMA-Factory's export: merge LoRA, re-save, shard), as a job",
)
async def export_job(
    request: Request, job_id: str = JOB_ID, who: Principal = Depends(authenticate), body: ExportRequest | None = None
):
    app = request.app.state
    row = await visible_job(request, job_id, who)
    body = body or ExportRequest()
    if row["status"] != JobStatus.SUCCEEDED:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job {job_id} is {row['status']}: only a succeeded job's output can be exported"
        )
    train = row["spec"].get("train") or {}
    if train.get("adc_export_of"):
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is itself an export (of {train['adc_export_of']})")
    method = train.get("finetuning_type", "lora")  # LLaMA-Factory's default
    if method not in METHODS:
        loc, why = ["train", "finetuning_type"], f"LLaMA-Factory's export takes {', '.join(METHODS)}"
        return _refused(loc, f"job {job_id} trained with finetuning_type {method!r}; {why}")
    if not row["job_dir"]:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no output folder")
    output = job_view(row)["output_dir"]
    model = (
        {"model_name_or_path": train.get("model_name_or_path"), "adapter_name_or_path": output}
        if method == "lora"
        else {"model_name_or_path": output}  # a full or freeze job's output is a whole model
    )
    export_train = {
        "adc_export_of": job_id,
        **model,
        "template": train.get("template"),
        "finetuning_type": method,
        "infer_dtype": body.dtype,
        "export_size": body.export_size,
        "export_legacy_format": body.export_legacy_format,
        **({"trust_remote_code": True} if train.get("trust_remote_code") else {}),
    }
    name = body.name or f"{row['name'][:56]}-export"
    spec = JobSpec(name=name, gpus=1, priority=row["priority"], preemptible=False, train=export_train)
    return await _queue_job(app, who, spec, export_train, audit_data={"export_of": job_id})


def _refused(loc: list, msg: str):
    return field_errors([{"loc": loc, "msg": msg}])
