"""Run in the trainer's environment: LLaMA-Factory's own preprocessing of a train section, without
any of ADC's code, compared column by column with the tokenized dataset an ADC job saved
(`tokenized_path`, which LLaMA-Factory writes from the very dataset it then trains on).

    .venv-trainer/bin/python tests/integration/trainer/llamafactory_reference.py TRAIN_JSON ADC_TOKENIZED_DIR

Prints one JSON line: {"rows": n, "columns": [...], "mismatched_rows": [...]}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def main() -> None:
    train = json.loads(open(sys.argv[1]).read())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
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
    theirs = load_from_disk(sys.argv[2])["train"]
    columns = [c for c in ours.column_names if c.endswith(("input_ids", "labels"))]
    mismatched = [i for i in range(max(len(ours), len(theirs)))
                  if i >= len(ours) or i >= len(theirs) or any(ours[i][c] != theirs[i][c] for c in columns)]
    print(json.dumps({"rows": len(ours), "adc_rows": len(theirs), "columns": columns, "mismatched_rows": mismatched}))


if __name__ == "__main__":
    main()
