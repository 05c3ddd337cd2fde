"""Export a finished job: merge its LoRA adapter into the base model, save a standard HF folder.

    python -m worker.trainer.export --job-output OUTPUT_DIR --out EXPORT_DIR [--base MODEL_DIR]

`--job-output` is the job's output_dir (or any folder holding adapter_config.json, such as a
checkpoint-N). The base model is the adapter's `base_model_name_or_path` unless --base is
given. The result loads with `AutoModelForCausalLM.from_pretrained(EXPORT_DIR)` alone: merged
weights, config, tokenizer and chat template, no peft needed. A job trained with
finetuning_type full/freeze already is a standard folder; it is copied as weights + tokenizer.

QLoRA adapters are merged into the base loaded in full precision (not re-quantized), which is
what one serves. The export is written to a temporary folder and renamed, like checkpoints.
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


def _dtype_from_name(name: str | None):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(name or "", None)


def export_model(job_output: str | os.PathLike, out_dir: str | os.PathLike, base_model: str | None = None,
                 dtype: str | None = None) -> Path:
    """Write a standalone model folder built from a job's output. Returns out_dir.
    Only local folders are read (paths, never hub ids), so nothing is downloaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(job_output).resolve()
    out = Path(out_dir).resolve()
    adapter_config = source / "adapter_config.json"
    if adapter_config.is_file():
        base = base_model or json.loads(adapter_config.read_text()).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise ExportError(f"base model {base!r} of the adapter in {source} is not a local model folder; pass --base")
        from peft import PeftModel

        torch_dtype = _dtype_from_name(dtype) or torch.float32
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
        model = PeftModel.from_pretrained(model, source).merge_and_unload()
        tokenizer_source = source if (source / "tokenizer_config.json").is_file() else Path(base)
    elif (source / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=_dtype_from_name(dtype) or "auto")
        tokenizer_source = source
    else:
        raise ExportError(f"{source} holds neither a LoRA adapter (adapter_config.json) nor a model (config.json)")

    staging = out.parent / f".{out.name}.exporting-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.config.use_cache = True  # exported for inference
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.trainer.export", description=__doc__.split("\n")[0])
    parser.add_argument("--job-output", required=True, help="the job's output_dir (or a checkpoint-N folder)")
    parser.add_argument("--out", required=True, help="folder to write the merged model into")
    parser.add_argument("--base", help="base model folder (default: the adapter's base_model_name_or_path)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="weights dtype of the export")
    args = parser.parse_args(argv)
    try:
        out = export_model(args.job_output, args.out, args.base, args.dtype)
    except ExportError as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
