"""Keys that need hardware or kernels this node lacks: refused before anything loads, naming the key.

LLaMA-Factory would otherwise fail deep inside a kernel or an import (or silently fall back);
ADC refuses such a job with exit 2 and a message a user can act on. Only what the node itself
decides is here; everything else LLaMA-Factory checks itself.
"""

from __future__ import annotations

# Quantization methods whose kernels exist only for CUDA GPUs (bitsandbytes also runs on CPU).
GPU_ONLY_QUANTIZATION = ("gptq", "awq", "aqlm", "eetq", "hqq", "mxfp4", "fp8")
# Keys that turn on a package ADC's trainer environment does not carry, with that package.
EXTRA_PACKAGES = {
    "use_unsloth": "unsloth (CUDA only)",
    "enable_liger_kernel": "liger-kernel (Triton, CUDA only)",
    "use_mca": "mcore-adapter (Megatron-Core)",
    "use_hyper_parallel": "hyper-parallel",
    "use_galore": "galore-torch",
    "use_apollo": "apollo-torch",
    "use_badam": "badam",
    "use_adam_mini": "adam-mini",
    "use_swanlab": "swanlab",
    "mixture_of_depths": "mixture-of-depth",
}
# Why a package is not in the trainer environment, where that is not just "not installed".
NOT_INSTALLABLE = {
    "mixture_of_depths": "mixture_of_depths needs mixture-of-depth (MoD), whose only release (1.2.0) imports "
    "TRANSFORMERS_CACHE from transformers, which transformers 5 removed: it cannot load beside "
    "LLaMA-Factory 0.9.5's transformers 5.6.0, so ADC's trainer environment does not carry it",
}

# What LLaMA-Factory's check_version demands for predict_with_generate (BLEU / ROUGE of generations).
GENERATION_METRICS = ("jieba", "nltk", "rouge-chinese")


def _on(args: dict, key: str) -> bool:
    value = args.get(key)
    return value not in (None, False, "", "false", "False", 0)


def refusals(args: dict, cuda: bool, bf16_gpu: bool, installed) -> list[dict]:
    """[{loc, msg}] for every key this node cannot honour. `installed(distribution) -> bool`."""
    errors: list[dict] = []

    def refuse(key: str, msg: str) -> None:
        errors.append({"loc": ["train", key], "msg": msg})

    where = "a CUDA GPU" if not cuda else "this GPU"
    if _on(args, "fp16") and not cuda:
        refuse("fp16", "fp16 mixed precision needs a CUDA GPU; this node has none (use bf16: true, which runs on CPU)")
    if _on(args, "bf16") and cuda and not bf16_gpu:
        refuse("bf16", "this GPU does not support bfloat16; use fp16: true or bf16: false")
    if _on(args, "pure_bf16") and not (cuda and bf16_gpu):
        refuse("pure_bf16", f"pure_bf16 needs a bf16-capable CUDA GPU, not {where}")
    if _on(args, "fp8") and not cuda:
        refuse("fp8", "fp8 training needs a CUDA GPU with FP8 support (Hopper or newer); this node has none")
    method = args.get("quantization_method") or "bnb"
    if _on(args, "quantization_bit") and method in GPU_ONLY_QUANTIZATION and not cuda:
        refuse(
            "quantization_method",
            f"quantization_method {method!r} has CUDA kernels only; this node has no GPU "
            "(quantization_method: bnb runs on CPU)",
        )
    # flash_attn fa2 without a GPU is LLaMA-Factory's to handle: it warns and keeps the default attention.
    if args.get("flash_attn") == "fa3" and not cuda:
        refuse("flash_attn", "flash_attn 'fa3' needs a CUDA GPU (Hopper); use fa2, sdpa or auto")
    if _on(args, "use_kt"):
        # KTransformers' SFT (LLaMA-Factory's requirements/ktransformers.txt: ktransformers[sft]) trains a MoE
        # model with its experts on the CPU and the rest on a CUDA GPU, through its own builds of
        # transformers and accelerate (transformers-kt, accelerate-kt) that LLaMA-Factory checks for.
        if not cuda:
            refuse(
                "use_kt",
                "use_kt (KTransformers' CPU-GPU MoE training) needs a CUDA GPU beside the CPU; this node has none",
            )
        elif not all(installed(p) for p in ("kt-kernel", "transformers-kt", "accelerate-kt")):
            refuse(
                "use_kt",
                "use_kt needs KTransformers (kt-kernel, transformers-kt, accelerate-kt: its own builds "
                "of transformers and accelerate), not installed in ADC's trainer environment",
            )
    if _on(args, "predict_with_generate"):  # LLaMA-Factory scores generations with its `metrics` extra
        missing = [p for p in GENERATION_METRICS if not installed(p)]
        if missing:
            refuse(
                "predict_with_generate",
                f"predict_with_generate needs {', '.join(missing)} (LLaMA-Factory's "
                "metrics extra), not installed in ADC's trainer environment",
            )
    for key, package in EXTRA_PACKAGES.items():
        if _on(args, key) and not installed(package.split(" ")[0]):
            refuse(
                key,
                NOT_INSTALLABLE.get(key)
                or f"{key} needs {package}, which is not installed in ADC's trainer environment",
            )
    return errors
