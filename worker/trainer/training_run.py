"""One run of the trainer: settings in, events out, an exit code back to the worker.

Order matters for exactness: the seed is set before the model is built (LoRA's initial
weights are random), the Trainer restores model, optimizer, scheduler and RNG state from a
checkpoint, and skips the batches already seen in the current epoch, so a resumed run takes
the same optimizer steps on the same samples as one that never stopped.

Outcomes:
- finished: final model saved in output_dir, `succeeded`, exit 0
- stop request agreed by all ranks: checkpoint at that step, `stopped`, exit 75
- out of memory: `oom` with the last complete checkpoint, exit 76
- bad configuration: `failed` with the errors, exit 2; anything else: `failed`, exit 1
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from worker.trainer import checkpoints
from worker.trainer.events import EventWriter
from worker.trainer.exit_codes import ExitCode
from worker.trainer.job_config import ConfigError, key_error
from worker.trainer.stop_request import StopRequest


def _device(local_rank: int):
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _resume_manifest(resume: str | None) -> dict | None:
    if not resume:
        return None
    path = Path(resume)
    if not path.is_dir():
        raise key_error("resume_from_checkpoint", f"{resume!r} is not a folder")
    if not (path / "trainer_state.json").is_file():
        raise key_error("resume_from_checkpoint", f"{resume!r} is not a complete checkpoint (no trainer_state.json)")
    if checkpoints.checkpoint_step(path) is None:
        raise key_error("resume_from_checkpoint", f"{resume!r} is not a checkpoint-N folder")
    return checkpoints.read_manifest(path)


def _training_arguments(settings: dict, plan, precision, device, output_dir: str):
    from transformers import TrainingArguments

    warmup = settings["warmup_steps"] if settings["warmup_steps"] > 0 else settings["warmup_ratio"]
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=plan.per_device,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        learning_rate=settings["learning_rate"],
        num_train_epochs=settings["num_train_epochs"],
        max_steps=plan.max_steps,
        lr_scheduler_type=settings["lr_scheduler_type"],
        warmup_steps=warmup,
        weight_decay=settings["weight_decay"],
        max_grad_norm=settings["max_grad_norm"],
        adam_beta1=settings["adam_beta1"],
        adam_beta2=settings["adam_beta2"],
        adam_epsilon=settings["adam_epsilon"],
        optim=settings["optim"],
        bf16=precision.bf16,
        fp16=precision.fp16,
        logging_strategy="steps",
        logging_steps=settings["logging_steps"],
        save_strategy="steps",
        save_steps=settings["save_steps"],
        seed=settings["seed"],
        ddp_timeout=settings["ddp_timeout"],
        ddp_backend=("nccl" if device.type == "cuda" else "gloo") if plan.world_size > 1 else None,
        ddp_find_unused_parameters=False,
        deepspeed=settings["deepspeed"],
        use_cpu=device.type == "cpu",
        dataloader_num_workers=0,
        dataloader_pin_memory=device.type == "cuda",
        remove_unused_columns=False,
        report_to="none",
        disable_tqdm=True,
    )


def _build_dataset(settings: dict, tokenizer):
    from worker.trainer.dataset_loading import DatasetError, load_datasets
    from worker.trainer.prompt_templates import TemplateError, select_renderer
    from worker.trainer.sample_encoding import EncodedDataset, encode_pretraining, encode_sft

    try:
        data = load_datasets(settings["dataset"], settings["dataset_dir"], settings["stage"], settings["max_samples"])
    except DatasetError as exc:
        raise key_error("dataset", str(exc)) from None
    if settings["stage"] == "pt":
        samples = encode_pretraining(data, tokenizer, settings["cutoff_len"])
    else:
        try:
            renderer = select_renderer(settings["template"], tokenizer)
            samples = encode_sft(data, renderer, tokenizer, settings["cutoff_len"], settings["train_on_prompt"])
        except TemplateError as exc:
            raise key_error("template", str(exc)) from None
    if not samples:
        raise key_error("cutoff_len", f"no sample keeps a token to learn within cutoff_len {settings['cutoff_len']}")
    return EncodedDataset(samples), data.dropped


def run(settings: dict, events: EventWriter, stop_request: StopRequest) -> ExitCode:
    from worker.trainer.batch_geometry import BatchGeometryError, plan_batch

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    output_dir = settings["output_dir"]
    resume = settings["resume_from_checkpoint"]
    resumed_manifest = _resume_manifest(resume)
    saved_world = (resumed_manifest or {}).get("world_size", world_size)
    if resumed_manifest and resumed_manifest.get("deepspeed") and saved_world != world_size:
        # ZeRO partitions optimizer state (and ZeRO-3 the weights) per rank.
        raise key_error(
            "resume_from_checkpoint",
            f"a DeepSpeed ZeRO checkpoint written by {saved_world} ranks resumes only on "
            f"{saved_world} ranks; this run has {world_size}",
        )
    try:  # before the heavy imports: a refused resize should not cost seconds
        plan = plan_batch(settings, world_size, resumed_manifest)
    except BatchGeometryError as exc:
        raise key_error(exc.key, str(exc)) from None

    from worker.trainer.model_setup import ModelSetupError, check_precision, load_model, load_tokenizer

    device = _device(local_rank)
    try:  # needs torch only, not transformers
        precision = check_precision(settings, device)
    except ModelSetupError as exc:
        raise key_error(exc.key, str(exc)) from None

    from transformers import set_seed

    from worker.trainer.adc_callback import ADCCallback
    from worker.trainer.adc_trainer import ADCTrainer
    from worker.trainer.sample_encoding import PaddingCollator

    if events.rank == 0:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        checkpoints.clear_staging(output_dir)
    arguments = _training_arguments(settings, plan, precision, device, output_dir)
    # Reading .device sets up the process group (and DeepSpeed's) before the model is built:
    # ZeRO-3 partitions parameters while loading and must know the world size by then.
    device = arguments.device
    if settings["deepspeed"] and world_size > 1:
        import deepspeed

        # On CPU, accelerate sets up torch.distributed but not DeepSpeed's view of it.
        deepspeed.init_distributed(dist_backend=arguments.ddp_backend)
    set_seed(settings["seed"])
    tokenizer = load_tokenizer(settings)
    dataset, dropped_records = _build_dataset(settings, tokenizer)
    try:
        model = load_model(settings, precision, device)
    except ModelSetupError as exc:
        raise key_error(exc.key, str(exc)) from None

    collator = PaddingCollator(tokenizer.pad_token_id)
    run_facts = {
        "samples": len(dataset),
        "dropped_records": dropped_records,
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "global_batch_size": plan.global_batch,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "batch_source": plan.source,
    }
    callback = ADCCallback(events, stop_request, collator, world_size, device, resume, run_facts)
    checkpoint_manifest = {
        **plan.as_manifest(),
        "seed": settings["seed"],
        "stage": settings["stage"],
        "finetuning_type": settings["finetuning_type"],
        "model_name_or_path": settings["model_name_or_path"],
        "quantization_bit": settings["quantization_bit"],
        "deepspeed": settings["deepspeed"],
        "batch_source": plan.source,
    }
    trainer = ADCTrainer(
        model=model,
        args=arguments,
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[callback],
        events=events,
        manifest=checkpoint_manifest,
        save_total_limit=settings["save_total_limit"],
        resumed_from=resume,
    )
    trainer.train(resume_from_checkpoint=resume)
    state = trainer.state
    if callback.stop_step is not None and state.global_step < state.max_steps:
        events.emit("stopped", step=state.global_step, checkpoint=str(trainer.last_checkpoint))
        return ExitCode.STOPPED_AFTER_CHECKPOINT
    trainer.save_model(output_dir)
    events.emit("succeeded", step=state.global_step, output_dir=str(output_dir), loss=callback.last_loss)
    return ExitCode.SUCCEEDED


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(exc)
    # CPU allocations that fail come back as a plain RuntimeError from torch's CPU allocator.
    return "DefaultCPUAllocator: can't allocate memory" in text or "CUDA out of memory" in text


def run_and_report(settings_loader, events: EventWriter, stop_request: StopRequest) -> ExitCode:
    """Run, turning every outcome into an event and an exit code. Only KeyboardInterrupt and
    SystemExit pass through (an operator's Ctrl-C is not a training failure)."""
    settings = None
    try:
        settings = settings_loader()
        return run(settings, events, stop_request)
    except ConfigError as exc:
        # Every rank reads the same config: one report (rank 0's) is enough.
        events.emit("failed", error=str(exc), errors=exc.errors, exit_code=int(ExitCode.CONFIG_ERROR))
        print(f"adc trainer: configuration error: {exc}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    except BaseException as exc:  # noqa: BLE001 - the trainer must report whatever killed it
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        traceback.print_exc()
        if is_out_of_memory(exc):
            last = checkpoints.latest_complete_checkpoint(settings["output_dir"]) if settings else None
            if last is None and settings and settings.get("resume_from_checkpoint"):
                last = settings["resume_from_checkpoint"]
            events.emit_from_any_rank(
                "oom", error=f"{type(exc).__name__}: {exc}"[:2000], last_checkpoint=str(last) if last else None
            )
            return ExitCode.OUT_OF_MEMORY
        events.emit_from_any_rank("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        return ExitCode.FAILED
