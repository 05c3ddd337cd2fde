"""Run in the trainer's environment: LLaMA-Factory's own preprocessing of train sections, without
any of ADC's code, compared column by column with the tokenized dataset each ADC job saved
(`tokenized_path`, which LLaMA-Factory writes from the very dataset it then trains on). One process
for every case: LLaMA-Factory is imported once.

    .venv-trainer/bin/python tests/integration/trainer/llamafactory_reference.py CASES_JSON

CASES_JSON holds [[train section, ADC's tokenized folder], ...]. Prints one JSON line: a list of
{"rows": n, "adc_rows": m, "columns": [...], "mismatched_rows": [...]}, one per case.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def compare(train: dict, adc_tokenized: str) -> dict:
    from datasets import load_from_disk
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    args = {k: v for k, v in train.items() if k not in ("tokenized_path", "resume_from_checkpoint")}
    args.update(output_dir=tempfile.mkdtemp(), do_train=True, overwrite_output_dir=True)
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    stage = "rm" if finetuning_args.stage == "dpo" else finetuning_args.stage  # as LLaMA-Factory's run_dpo does
    ours = get_dataset(template, model_args, data_args, training_args, stage=stage, **tokenizer_module)["train_dataset"]
    theirs = load_from_disk(adc_tokenized)["train"]
    columns = [c for c in ours.column_names if c.endswith(("input_ids", "labels"))]
    mismatched = [
        i
        for i in range(max(len(ours), len(theirs)))
        if i >= len(ours) or i >= len(theirs) or any(ours[i][c] != theirs[i][c] for c in columns)
    ]
    return {"rows": len(ours), "adc_rows": len(theirs), "columns": columns, "mismatched_rows": mismatched}


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cases = json.loads(open(sys.argv[1]).read())
    print(json.dumps([compare(train, tokenized) for train, tokenized in cases]))


if __name__ == "__main__":
    main()
