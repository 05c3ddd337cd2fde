"""What ADC's trainer leaves where `llamafactory-cli train` differs only by ADC's settings: LLaMA-Factory's
own fields in the results files (`total_flos`, which transformers' log printer under ADC's disable_tqdm
used to take out); `flash_attn: fa2` on a node without its kernels, which LLaMA-Factory answers with
a warning and the default attention; and a DeepSpeed + bf16 config on a node without a GPU, which
transformers trains only with `use_cpu` (ADC knows the node has no GPU and sets it)."""

from __future__ import annotations

import json

from tests.integration.trainer.trainer_process import base_settings, run_trainer


def test_results_files_hold_total_flos_and_fa2_falls_back_on_cpu(tmp_path, tiny_model_dir):
    run = run_trainer(tmp_path / "job", base_settings(tiny_model_dir, max_steps=2, save_steps=500, flash_attn="fa2"))
    assert run.returncode == 0, run.log_tail()
    for name in ("all_results.json", "train_results.json"):
        results = json.loads((run.output_dir / name).read_text())
        assert results["total_flos"] > 0, (name, results)
    assert "FlashAttention-2 is not installed" in (run.job_dir / "trainer.log").read_text()


def test_deepspeed_with_bf16_trains_on_a_cpu_node(tmp_path, tiny_model_dir):
    deepspeed = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2},
    }
    run = run_trainer(tmp_path / "job", base_settings(tiny_model_dir, max_steps=2, bf16=True, deepspeed=deepspeed))
    assert run.returncode == 0, run.log_tail()  # was exit 2: "Your setup doesn't support bf16/gpu"
    assert (run.output_dir / "checkpoint-2" / "global_step2").is_dir()  # DeepSpeed's own checkpoint
