"""Token ids, labels, cutoff and batching with the tiny model's real tokenizer."""

from __future__ import annotations

import pytest

from tests.integration.trainer.trainer_process import EXAMPLE_DATA
from worker.trainer.dataset_loading import load_datasets
from worker.trainer.sample_encoding import (
    IGNORE_INDEX,
    PaddingCollator,
    encode_exchanges,
    encode_pretraining,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_only_the_response_is_learned(tokenizer):
    sample = encode_exchanges([("Question? ", "Answer.")], tokenizer, cutoff_len=512)
    prompt, response = ids(tokenizer, "Question? "), ids(tokenizer, "Answer.")
    assert sample.input_ids == prompt + response
    assert sample.labels == [IGNORE_INDEX] * len(prompt) + response
    on_prompt = encode_exchanges([("Question? ", "Answer.")], tokenizer, cutoff_len=512, train_on_prompt=True)
    assert on_prompt.labels == on_prompt.input_ids


def test_cutoff_keeps_half_for_the_response_and_drops_later_exchanges(tokenizer):
    prompt_text, response_text = "word " * 40, "reply " * 40
    sample = encode_exchanges([(prompt_text, response_text), ("more", "again")], tokenizer, cutoff_len=20)
    assert len(sample.input_ids) == 20
    learned = [label for label in sample.labels if label != IGNORE_INDEX]
    assert learned == ids(tokenizer, response_text)[:10]
    assert sample.input_ids[:10] == ids(tokenizer, prompt_text)[:10]
    # A short prompt leaves the rest of the budget to the response.
    short = encode_exchanges([("Hi", response_text)], tokenizer, cutoff_len=20)
    assert len([x for x in short.labels if x != IGNORE_INDEX]) == 20 - len(ids(tokenizer, "Hi"))


def test_sample_without_anything_to_learn_is_skipped(tokenizer):
    assert encode_exchanges([("a", "")], tokenizer, cutoff_len=8) is None


def test_pretraining_packs_texts_into_blocks(tokenizer):
    data = load_datasets(["c4_demo"], EXAMPLE_DATA, "pt", max_samples=4)
    stream = []
    for text in data.texts:
        stream += ids(tokenizer, text) + [tokenizer.eos_token_id]
    blocks = encode_pretraining(data, tokenizer, cutoff_len=100)
    assert len(blocks) == len(stream) // 100
    assert all(len(b.input_ids) == 100 and b.labels == b.input_ids for b in blocks)
    assert [t for b in blocks for t in b.input_ids] == stream[: len(blocks) * 100]


def test_collator_pads_right_and_counts_real_tokens(tokenizer):
    short = encode_exchanges([("a", "b")], tokenizer, cutoff_len=64)
    long = encode_exchanges([("a longer prompt", "and a longer answer")], tokenizer, cutoff_len=64)
    collator = PaddingCollator(tokenizer.pad_token_id)
    batch = collator([short, long])
    width = len(long.input_ids)
    assert batch["input_ids"].shape == (2, width)
    assert batch["attention_mask"][0].tolist() == [1] * len(short.input_ids) + [0] * (width - len(short.input_ids))
    assert batch["labels"][0, len(short.input_ids):].eq(IGNORE_INDEX).all()
    assert batch["input_ids"][0, len(short.input_ids):].eq(tokenizer.pad_token_id).all()
    assert collator.tokens_seen == len(short.input_ids) + len(long.input_ids) and collator.samples_seen == 2
