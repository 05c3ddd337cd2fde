"""Export a finished job with LLaMA-Factory's own export (`llamafactory-cli export`): merge a LoRA
adapter into its base model and write a standard Hugging Face folder.

    .venv-trainer/bin/python -m worker.trainer.export --job-output OUTPUT_DIR --out EXPORT_DIR \
        [--base MODEL_DIR] [--template NAME] [--dtype auto|float32|bfloat16|float16]

`--job-output` is the job's output_dir (or a checkpoint-N folder). The base model is the
adapter's `base_model_name_or_path` unless --base is given; a job trained with finetuning_type
full/freeze already is a model, which is re-saved. The result loads with
`AutoModelForCausalLM.from_pretrained(EXPORT_DIR)` alone (merged weights, config, tokenizer with
its chat template, LLaMA-Factory's Ollama Modelfile). Only local folders are read, so nothing is
downloaded. The export is written to a temporary folder and renamed, like checkpoints.

An export job runs LLaMA-Factory's export through the worker: a job whose train section is an export
config (`export_dir` set, nothing to train; `adapter_name_or_path: job://NAME` names an earlier job's
adapter), or the api's export of a job (`POST /v1/jobs/{id}/export`: these export keys plus
`adc_export_of`, the source job). `run_export_job` writes the model into the export job's own
output_dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path


class ExportError(ValueError):
    pass


def export_arguments(job_output: Path, out: Path, base_model: str | None, template: str | None, dtype: str) -> dict:
    """LLaMA-Factory's export arguments for a job's output folder."""
    adapter_config = job_output / "adapter_config.json"
    if adapter_config.is_file():
        base = base_model or json.loads(adapter_config.read_text()).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise ExportError(
                f"base model {base!r} of the adapter in {job_output} is not a local model folder; pass --base"
            )
        args = {"model_name_or_path": base, "adapter_name_or_path": str(job_output), "finetuning_type": "lora"}
    elif (job_output / "config.json").is_file():
        args = {"model_name_or_path": str(job_output), "finetuning_type": "full"}
    else:
        raise ExportError(f"{job_output} holds neither a LoRA adapter (adapter_config.json) nor a model (config.json)")
    return {
        **args,
        "template": template,
        "export_dir": str(out),
        "export_device": "cpu",
        "infer_dtype": dtype,
        "trust_remote_code": False,
    }


def export_model(
    job_output: str | os.PathLike,
    out_dir: str | os.PathLike,
    base_model: str | None = None,
    template: str | None = None,
    dtype: str = "auto",
) -> Path:
    source, out = Path(job_output).resolve(), Path(out_dir).resolve()
    staging = out.parent / f".{out.name}.exporting-{os.getpid()}"
    args = export_arguments(source, staging, base_model, template, dtype)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llamafactory.train.tuner import export_model as llamafactory_export

    shutil.rmtree(staging, ignore_errors=True)
    try:
        llamafactory_export(args)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


# Keys the worker adds to every train.yaml, which LLaMA-Factory's export does not take.
_WORKER_KEYS = ("output_dir", "resume_from_checkpoint")


def run_export_job(args: dict, source_job: str | None, events) -> int:
    """An export job: a LLaMA-Factory export config (`llamafactory-cli export`: merge a LoRA adapter,
    re-save a full or freeze model, `export_size` shards, `export_legacy_format`, quantization), or the
    api's export of a job (`POST /v1/jobs/{id}/export`, `source_job`). LLaMA-Factory writes the model into
    a staging folder inside output_dir (the one folder a sandboxed trainer may write), whose files then
    become the job's output, readable by the team (not only by the trainer's uid)."""
    from worker.trainer.exit_codes import ExitCode
    from worker.trainer.job_config import key_error

    out = Path(args.get("output_dir") or "")
    if not args.get("output_dir") or not args.get("model_name_or_path"):
        raise key_error("model_name_or_path", "an export job needs model_name_or_path and output_dir")
    if (problem := quantization_refusal(args)) is not None:
        raise key_error("export_quantization_bit", problem)
    staging = out / ".exporting"
    export_args = {k: v for k, v in args.items() if k not in _WORKER_KEYS} | {"export_dir": str(staging)}
    events.emit("started", max_steps=0, world_size=1, resumed_from=None, step=0, export_of=source_job)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llamafactory.train.tuner import export_model as llamafactory_export

    shutil.rmtree(staging, ignore_errors=True)
    try:
        llamafactory_export(export_args)
    except ValueError as exc:  # LLaMA-Factory's refusal of the export's arguments
        raise key_error("export_dir", f"LLaMA-Factory refused the export: {exc}") from None
    from worker.trainer.results_files import readable_by_team

    for entry in sorted(staging.iterdir()):
        os.replace(entry, out / entry.name)
    staging.rmdir()
    readable_by_team(out)
    events.emit("succeeded", step=0, output_dir=str(out), loss=None, export_of=source_job)
    return ExitCode.SUCCEEDED


def quantization_refusal(args: dict) -> str | None:
    """LLaMA-Factory quantizes an export with GPTQ (transformers' GPTQConfig through optimum and gptqmodel),
    which runs on a CUDA GPU only: why this node cannot, or None."""
    if args.get("export_quantization_bit") is None:
        return None
    import importlib.util

    import torch

    missing = [m for m in ("optimum", "gptqmodel") if importlib.util.find_spec(m) is None]
    if not torch.cuda.is_available():
        return "export quantization (GPTQ) needs a CUDA GPU; this node has none"
    if missing:
        return f"export quantization (GPTQ) needs {', '.join(missing)}, not installed in ADC's trainer environment"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.trainer.export", description=__doc__.split("\n")[0])
    parser.add_argument("--job-output", required=True, help="the job's output_dir (or a checkpoint-N folder)")
    parser.add_argument("--out", required=True, help="folder to write the merged model into")
    parser.add_argument("--base", help="base model folder (default: the adapter's base_model_name_or_path)")
    parser.add_argument("--template", help="LLaMA-Factory template the job trained with (for the Modelfile)")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    args = parser.parse_args(argv)
    try:
        out = export_model(args.job_output, args.out, args.base, args.template, args.dtype)
    except ExportError as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
