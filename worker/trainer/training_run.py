"""One run of the trainer: LLaMA-Factory's `run_exp` with ADC's callback, an exit code back to the worker.

LLaMA-Factory does the training (templates, datasets, model loading, stages, fine-tuning
methods, DeepSpeed, output files). Around it ADC:
1. plans the batch (resize keeps the global batch: gradient_accumulation_steps is rewritten);
2. refuses keys this node's hardware cannot honour (device_limits.py), and has LLaMA-Factory
   parse the arguments once up front, so a bad config is exit 2 naming its key, not a crash;
3. makes checkpoints atomic with a manifest (atomic_checkpoints.py) and adds `ADCCallback`;
4. maps the outcome to an event and an exit code.

Exactness: LLaMA-Factory sets the seed before the model is built, and transformers' Trainer
restores model, optimizer, scheduler and RNG state from a checkpoint and skips the batches
already seen in the current epoch, so a resumed run takes the same optimizer steps on the same
samples as one that never stopped.

Outcomes:
- finished: LLaMA-Factory's final model and files in output_dir, `succeeded`, exit 0
- stop request agreed by all ranks: checkpoint at that step, `stopped`, exit 75
- out of memory: `oom` with the last complete checkpoint, exit 76
- a prediction or evaluation job (`do_predict` / `do_eval` without `do_train`, e.g. LLaMA-Factory's
  batch prediction with metrics, `predict_with_generate`): `started` with no steps, LLaMA-Factory's
  result files (predict_results.json, generated_predictions.jsonl) in output_dir, `succeeded`, exit 0
- bad configuration (refused by ADC or by LLaMA-Factory before the first step): `failed`, exit 2
- anything else: `failed`, exit 1
- resumed from a checkpoint already at max_steps: nothing is trained (transformers would take one
  more step when max_steps is not a whole number of epochs), the final model is that checkpoint's
  weights unless the output folder already holds a final model of that step; `succeeded`, exit 0
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import re
import sys
import traceback
from pathlib import Path

from worker.trainer import checkpoints, fence
from worker.trainer.events import EventWriter
from worker.trainer.exit_codes import ExitCode
from worker.trainer.job_config import ConfigError, is_export, key_error
from worker.trainer.stop_request import StopRequest
from worker.trainer.tokenized_cache import TokenizedCache
from worker.trainer.warm_start import GoError, go_file_from_environment, install_before_train, wait_for_go

# transformers' TrainingArguments defaults, which LLaMA-Factory keeps.
_BATCH_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "max_steps": -1}


def resume_garbage_collection() -> None:
    """The collector back on (__main__ turns it off while the trainer gets ready). What getting ready
    built (modules, model, dataset) is frozen first: it lives until the exit, so training's
    collections need not walk it."""
    gc.freeze()
    gc.enable()


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


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# Names LLaMA-Factory's messages use for a key of the config (model/adapter.py says
# `num_layer_trainable` for freeze_trainable_layers).
_LF_INTERNAL_NAMES = {"num_layer_trainable": "freeze_trainable_layers"}


def _located(message: str, args: dict) -> list[dict]:
    """LLaMA-Factory's refusal as errors naming the keys it mentions (`key` in backticks, or
    the unused-keys list of HfArgumentParser); else the whole train section."""
    unused = re.search(r"not used by the HfArgumentParser: \[(.*)\]", message)
    if unused:
        keys = re.findall(r"'([^']+)'", unused.group(1))
        return [{"loc": ["train", key], "msg": f"unknown key {key!r}: not a LLaMA-Factory argument"} for key in keys]
    quoted = [_LF_INTERNAL_NAMES.get(key, key) for key in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", message)]
    named = [key for key in quoted if key in args or key in _LF_INTERNAL_NAMES.values()]
    # Else the key whose value the message quotes (a path LLaMA-Factory cannot find, say).
    named += [key for key, value in args.items() if isinstance(value, str) and len(value) >= 4 and value in message]
    return [{"loc": ["train", key], "msg": message} for key in named[:1]] or [{"loc": ["train"], "msg": message}]


def _config_error(message: str, args: dict) -> ConfigError:
    """LLaMA-Factory's refusal as a configuration error; its text starts with the key it is about
    when the text does not say it (the job's status reason is this text)."""
    errors = _located(message, args)
    key = errors[0]["loc"][-1] if len(errors[0]["loc"]) > 1 else None
    return ConfigError(f"{key}: {message}" if key and key not in message else message, errors)


def _preflight(args: dict) -> None:
    """Hardware refusals, then LLaMA-Factory's own argument parsing and checks."""
    import torch

    cuda = torch.cuda.is_available()
    errors = device_refusals(args, cuda) + _unwritable_tokenized_path(args)
    if errors:
        raise ConfigError("; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in errors), errors)
    from llamafactory.hparams import get_train_args

    try:
        get_train_args(dict(args))
    except (ValueError, ImportError) as exc:
        raise _config_error(str(exc), args) from None


def _unwritable_tokenized_path(args: dict) -> list[dict]:
    """A `tokenized_path` that does not exist yet is where LLaMA-Factory writes the tokenized data
    (then exits): refused here if this trainer cannot create it, rather than failing after
    preprocessing (a sandboxed trainer writes only inside its job folder)."""
    path = args.get("tokenized_path")
    if not isinstance(path, str) or not path or os.path.exists(path):
        return []
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if os.access(parent, os.W_OK):
        return []
    return [
        {
            "loc": ["train", "tokenized_path"],
            "msg": f"tokenized_path {path!r} does not exist, so LLaMA-Factory would write the tokenized dataset "
            f"there, but {parent!r} is not writable for this trainer; name an existing tokenized dataset, "
            "or a folder this job may write",
        }
    ]


def device_refusals(args: dict, cuda: bool) -> list[dict]:
    import torch

    from worker.trainer.device_limits import refusals

    bf16_gpu = cuda and torch.cuda.is_bf16_supported()
    return refusals(args, cuda, bf16_gpu, _installed)


def _default_arguments(args: dict, world_size: int) -> dict:
    """What ADC sets when the config does not: a job trains unless it says what else to do
    (transformers' do_train defaults to false, which would run nothing); token counts for its
    events; the plain AdamW for GaLore and APOLLO (below); off-GPU, `use_cpu` (transformers refuses bf16 on CPU without it), gloo, and the plain
    CPU device (accelerate would place distributed CPU ranks on "cpu:0", which torch.load cannot
    map a checkpoint to on resume)."""
    import torch

    defaults = {"include_num_input_tokens_seen": "non_padding", "disable_tqdm": True}
    if not any(key in args for key in ("do_train", "do_eval", "do_predict")):
        defaults["do_train"] = True
    if args.get("use_galore") or args.get("use_apollo"):
        # LLaMA-Factory 0.9.5 builds GaLore's and APOLLO's optimizers for optim adamw_torch (GaLore also
        # for the 8-bit AdamWs and adafactor) and raises on any other; transformers 5's default is
        # adamw_torch_fused, the same AdamW fused, which its examples (no `optim`) would stop on.
        defaults["optim"] = "adamw_torch"
    if not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
        # DeepSpeed sets up its own CPU accelerator; with bf16 transformers still asks for use_cpu (it
        # refuses bf16 without a GPU otherwise), and DeepSpeed trains on with it.
        if not args.get("deepspeed") or args.get("bf16"):
            defaults["use_cpu"] = True
        if world_size > 1 or args.get("deepspeed"):
            defaults["ddp_backend"] = "gloo"
    return {**defaults, **args}


def run(args: dict, adc: dict, events: EventWriter, stop_request: StopRequest) -> ExitCode:
    from worker.trainer.batch_geometry import BatchGeometryError, plan_batch

    if adc.get("adc_serve"):  # a serving job: LLaMA-Factory's chat API on the worker's socket (serve.py)
        from worker.trainer.serve import run_serve

        return run_serve(args, events, stop_request)
    if adc.get("adc_export_of") or is_export(args):  # LLaMA-Factory's export, not a training run
        from worker.trainer.export import run_export_job

        resume_garbage_collection()
        return run_export_job(args, adc.get("adc_export_of"), events)

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    resume = args.get("resume_from_checkpoint") or _implicit_resume(args)
    if resume:
        args = {**args, "resume_from_checkpoint": resume}
    resumed_manifest = _resume_manifest(resume)
    saved_world = (resumed_manifest or {}).get("world_size", world_size)
    if resumed_manifest and resumed_manifest.get("deepspeed") and saved_world != world_size:
        # ZeRO partitions optimizer state (and ZeRO-3 the weights) per rank.
        raise key_error(
            "resume_from_checkpoint",
            f"a DeepSpeed ZeRO checkpoint written by {saved_world} ranks resumes only on "
            f"{saved_world} ranks; this run has {world_size}",
        )
    geometry = {
        **_BATCH_DEFAULTS,
        **{k: args[k] for k in _BATCH_DEFAULTS if k in args},
        "adc_global_batch_size": adc.get("adc_global_batch_size"),
    }
    try:  # before the heavy imports: a refused resize should not cost seconds
        plan = plan_batch(geometry, world_size, resumed_manifest)
    except BatchGeometryError as exc:
        raise key_error(exc.key, str(exc)) from None
    args = {**args, "gradient_accumulation_steps": plan.gradient_accumulation_steps}
    if plan.max_steps != geometry["max_steps"]:
        args["max_steps"] = plan.max_steps
    args = _default_arguments(args, world_size)
    tokenized = TokenizedCache.for_run(args)
    if tokenized is not None:
        args["tokenized_path"] = tokenized.tokenized_path
    _preflight(args)

    from llamafactory.train.tuner import run_exp

    from worker.trainer.adc_callback import ADCCallback, StoppedAfterCheckpoint
    from worker.trainer.atomic_checkpoints import CheckpointPublisher
    from worker.trainer.results_files import keep_total_flos, readable_by_team
    from worker.trainer.token_count import TokenCount

    output_dir = str(args.get("output_dir") or "")
    go_file = go_file_from_environment()  # a warm trainer: the source may still be saving into .staging
    if events.rank == 0 and output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        if go_file is None:
            checkpoints.clear_staging(output_dir)
    manifest = {
        **plan.as_manifest(),
        "seed": args.get("seed", 42),
        "stage": args.get("stage", "sft"),
        "finetuning_type": args.get("finetuning_type", "lora"),
        "model_name_or_path": args.get("model_name_or_path"),
        "quantization_bit": args.get("quantization_bit"),
        "deepspeed": args.get("deepspeed"),
        "batch_source": plan.source,
    }
    if go_file is None and (finished := _finished_at(resume, int(args.get("max_steps", -1)))) is not None:
        return _finish_without_training(resume, finished, output_dir, args, events, world_size)
    publisher = CheckpointPublisher(events, manifest, resume)
    publisher.install()
    fence.guard_final_output()  # a superseded attempt's final save is refused, like its checkpoints
    run_facts = {
        "global_batch_size": plan.global_batch,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "batch_source": plan.source,
    }
    tokens = TokenCount()
    tokens.install()
    keep_total_flos()  # all_results.json as LLaMA-Factory's own run writes it

    def before_train(trainer, resume_from: str | None) -> str | None:
        """The dataset is built and the model too: publish the tokenized entry; a warm trainer waits here."""
        resume_garbage_collection()
        if tokenized is not None and events.rank == 0:
            tokenized.publish()
        if go_file is None:
            return resume_from
        events.emit("prepared", resumed_from_candidate=resume_from)
        resume_from = wait_for_go(go_file)
        again = plan_batch(geometry, world_size, _resume_manifest(resume_from))
        if (again.gradient_accumulation_steps, again.max_steps) != (plan.gradient_accumulation_steps, plan.max_steps):
            raise GoError(f"checkpoint {resume_from} asks for another batch plan than this trainer was built for")
        if events.rank == 0 and output_dir:
            checkpoints.clear_staging(output_dir)  # the source has exited: what it staged is nobody's
        publisher.resumed_from = Path(resume_from) if resume_from else None
        trainer.args.resume_from_checkpoint = resume_from
        return resume_from

    install_before_train(before_train)
    callback = ADCCallback(events, stop_request, world_size, run_facts, tokens)
    if not trains(args) and events.rank == 0:  # no on_train_begin: the job starts with its predictions
        events.emit("started", max_steps=0, world_size=world_size, resumed_from=None, step=0)
    try:
        run_exp(args, callbacks=[callback])
    except StoppedAfterCheckpoint as stop:
        events.emit("stopped", step=stop.step, checkpoint=str(publisher.last_checkpoint))
        return ExitCode.STOPPED_AFTER_CHECKPOINT
    except (ValueError, FileNotFoundError) as exc:
        if callback.started:
            raise
        # LLaMA-Factory refuses data and templates while building the dataset: still configuration.
        raise _config_error(f"{type(exc).__name__}: {exc}", args) from exc
    if events.rank == 0 and output_dir:
        readable_by_team(Path(output_dir))  # the model is the team's (a later job may read it: job://)
    events.emit("succeeded", step=callback.final_step, output_dir=output_dir, loss=callback.last_loss)
    return ExitCode.SUCCEEDED


def trains(args: dict) -> bool:
    """Whether LLaMA-Factory trains (do_train, which ADC sets when none of do_train/do_eval/do_predict is)."""
    return bool(args.get("do_train", not any(args.get(k) for k in ("do_eval", "do_predict"))))


def _implicit_resume(args: dict) -> str | None:
    """The checkpoint LLaMA-Factory would resume from by itself (the newest in output_dir, unless
    overwrite_output_dir): named here, so that everything a resume implies (the manifest's batch,
    a checkpoint already at max_steps) holds for it as for an explicit one."""
    output_dir = args.get("output_dir")
    if not output_dir or args.get("overwrite_output_dir") or not trains(args):
        return None
    latest = checkpoints.latest_complete_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    return str(latest) if latest else None


def _finished_at(resume: str | None, max_steps: int) -> int | None:
    """The step of a resumed checkpoint that is already at (or past) max_steps; else None."""
    step = checkpoints.checkpoint_step(resume) if resume else None
    return step if step is not None and 0 < max_steps <= step else None


def _finish_without_training(
    resume: str, step: int, output_dir: str, args: dict, events: EventWriter, world_size: int
) -> ExitCode:
    if events.rank == 0 and output_dir:
        with fence.holding(*fence.from_environment()):  # a superseded attempt copies nothing
            checkpoints.publish_final_model(resume, output_dir, step)
    events.emit("started", max_steps=int(args["max_steps"]), world_size=world_size, resumed_from=resume, step=step)
    events.emit("succeeded", step=step, output_dir=output_dir, loss=None, trained_steps=0)
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


def run_and_report(config_loader, events: EventWriter, stop_request: StopRequest) -> ExitCode:
    """Run, turning every outcome into an event and an exit code. Only KeyboardInterrupt and
    SystemExit pass through (an operator's Ctrl-C is not a training failure)."""
    args: dict | None = None
    try:
        args, adc = config_loader()
        return run(args, adc, events, stop_request)
    except ConfigError as exc:
        # Every rank reads the same config: one report (rank 0's) is enough.
        events.emit("failed", error=str(exc)[:2000], errors=exc.errors, exit_code=int(ExitCode.CONFIG_ERROR))
        print(f"adc trainer: configuration error: {exc}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    except BaseException as exc:  # noqa: BLE001 - the trainer must report whatever killed it
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        traceback.print_exc()
        if is_out_of_memory(exc):
            output_dir = (args or {}).get("output_dir")
            last = checkpoints.latest_complete_checkpoint(output_dir) if output_dir else None
            if last is None and args and args.get("resume_from_checkpoint"):
                last = args["resume_from_checkpoint"]
            events.emit_from_any_rank(
                "oom",
                error=f"{type(exc).__name__}: {exc}"[:2000],
                last_checkpoint=str(last) if last else None,
            )
            return ExitCode.OUT_OF_MEMORY
        events.emit_from_any_rank("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        return ExitCode.FAILED
