"""A tiny Llama built locally: random weights (fixed seed) and a BPE tokenizer trained here.

Models cannot be downloaded on ADC's machines, yet the trainer must be tested on a real
transformers model with a real tokenizer. This builds one in seconds and saves it as a
standard Hugging Face folder (config.json, model.safetensors, tokenizer files, chat template)
that `AutoModelForCausalLM` / `AutoTokenizer` load like any other.

    python -m worker.trainer.tiny_model --out DIR                 # ~0.2M parameters
    python -m worker.trainer.tiny_model --out DIR --size 13m      # ~13M, for benchmarks

Idempotent: a folder that already holds a complete model is left as it is. The folder is
built under a temporary name and renamed, so a concurrent or interrupted build never leaves
a half-written model behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MARKER = "adc_tiny_model.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER)
# Qwen's (ChatML) and Llama-3's special tokens, so that LLaMA-Factory's `qwen*` and `llama3`
# templates encode their markers as single tokens, as they do on the real models.
QWEN_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA3_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
SPECIAL_TOKENS = QWEN_TOKENS + LLAMA3_TOKENS
# ChatML, the layout Qwen models use: the tokenizer's own chat template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_FIXTURES = Path(__file__).resolve().parents[2] / "examples" / "data"
_FALLBACK_TEXT = (
    "The quick brown fox jumps over the lazy dog. Give three tips for staying healthy. "
    "Eat a balanced diet, exercise regularly and get enough sleep. What is the capital of France? "
    "Paris is the capital of France. Write a short poem about the sea."
)


@dataclass(frozen=True)
class TinyModelShape:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 1024
    max_positions: int = 4096
    seed: int = 1234


SIZES = {
    "tiny": TinyModelShape(),
    # ~13M parameters: big enough that a step costs more than the trainer's bookkeeping.
    "13m": TinyModelShape(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=1024, vocab=4096),
}


def is_complete(out_dir: str | os.PathLike) -> bool:
    out = Path(out_dir)
    return all((out / name).is_file() for name in REQUIRED_FILES)


def _training_text(corpus: Path | None) -> list[str]:
    source = corpus or (_FIXTURES / "alpaca_en_demo.json")
    if not source.is_file():
        return [_FALLBACK_TEXT] * 4
    if source.suffix == ".jsonl":
        records = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    else:
        records = json.loads(source.read_text())
    texts = []
    for record in records:
        if isinstance(record, dict):
            texts.extend(str(v) for v in record.values() if isinstance(v, str) and v)
    return texts or [_FALLBACK_TEXT]


def _build_tokenizer(shape: TinyModelShape, corpus: Path | None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_text(corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|begin_of_text|>",
        additional_special_tokens=[
            t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>", "<|begin_of_text|>")
        ],
        model_max_length=shape.max_positions,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_llama(
    out_dir: str | os.PathLike,
    shape: TinyModelShape | None = None,
    corpus: str | os.PathLike | None = None,
    **overrides,
) -> Path:
    """Build the model into out_dir (no-op when a complete one is there). Returns out_dir."""
    out = Path(out_dir).resolve()
    if is_complete(out):
        return out
    shape = shape or TinyModelShape()
    if overrides:
        shape = TinyModelShape(**{**asdict(shape), **overrides})

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    staging = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        tokenizer = _build_tokenizer(shape, Path(corpus) if corpus else None)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=shape.hidden,
            intermediate_size=shape.intermediate,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads,
            max_position_embeddings=shape.max_positions,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(shape.seed)
        model = LlamaForCausalLM(config).to(torch.float32)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        parameters = sum(p.numel() for p in model.parameters())
        (staging / MARKER).write_text(json.dumps({**asdict(shape), "parameters": parameters}, indent=2) + "\n")
        for file in staging.iterdir():  # safetensors writes 0600; trainers run as another, unprivileged uid
            file.chmod(0o644)
        if out.exists() and not is_complete(out):
            shutil.rmtree(out)
        try:
            os.replace(staging, out)
        except OSError:
            if not is_complete(out):  # lost a race to another builder: theirs is as good
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a tiny Llama with a locally trained tokenizer.")
    parser.add_argument("--out", required=True, help="folder to write the model into")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="preset shape")
    for field in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "seed"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, dest=field, help=f"override the preset's {field}")
    parser.add_argument("--corpus", help="json/jsonl file whose strings train the tokenizer")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k in TinyModelShape.__dataclass_fields__ and v is not None}
    out = build_tiny_llama(args.out, SIZES[args.size], corpus=args.corpus, **overrides)
    info = json.loads((out / MARKER).read_text())
    print(f"{out}: {info['parameters']:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
