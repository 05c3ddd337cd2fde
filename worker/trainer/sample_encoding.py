"""Token ids and labels for training, and the collator that batches them.

SFT: each exchange's prompt text and response text are tokenized separately and joined;
prompt tokens get label -100 (not learned) unless train_on_prompt. `cutoff_len` bounds a
sample: when an exchange does not fit, the response keeps at least half of what is left
(the part being learned), the prompt keeps its beginning, and later exchanges are dropped.
A sample left with nothing to learn is skipped.

PT: texts are tokenized, each followed by EOS, concatenated and cut into blocks of
cutoff_len tokens (the tail shorter than a block is kept only when it is all there is).

The collator pads on the right to the longest sample of the batch and counts real tokens,
which the ADC callback turns into tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.trainer.dataset_loading import LoadedData

IGNORE_INDEX = -100


@dataclass
class EncodedSample:
    input_ids: list[int]
    labels: list[int]


def _tokenize(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _fit(prompt: list[int], response: list[int], budget: int) -> tuple[list[int], list[int]]:
    if len(prompt) + len(response) <= budget:
        return prompt, response
    response_keep = min(len(response), max(budget // 2, budget - len(prompt)))
    return prompt[: budget - response_keep], response[:response_keep]


def encode_exchanges(
    exchanges: list[tuple[str, str]], tokenizer, cutoff_len: int, train_on_prompt: bool = False
) -> EncodedSample | None:
    input_ids: list[int] = []
    labels: list[int] = []
    for prompt_text, response_text in exchanges:
        budget = cutoff_len - len(input_ids)
        if budget <= 0:
            break
        prompt, response = _fit(_tokenize(tokenizer, prompt_text), _tokenize(tokenizer, response_text), budget)
        input_ids += prompt + response
        labels += (prompt if train_on_prompt else [IGNORE_INDEX] * len(prompt)) + response
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return EncodedSample(input_ids, labels)


def encode_sft(data: LoadedData, renderer, tokenizer, cutoff_len: int, train_on_prompt: bool) -> list[EncodedSample]:
    eos = tokenizer.eos_token or ""
    samples = []
    for conversation in data.conversations:
        sample = encode_exchanges(renderer.render(conversation, eos), tokenizer, cutoff_len, train_on_prompt)
        if sample is not None:
            samples.append(sample)
    return samples


def encode_pretraining(data: LoadedData, tokenizer, cutoff_len: int) -> list[EncodedSample]:
    stream: list[int] = []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for text in data.texts:
        stream += _tokenize(tokenizer, text) + eos
    blocks = [stream[i : i + cutoff_len] for i in range(0, len(stream), cutoff_len)]
    if len(blocks) > 1 and len(blocks[-1]) < cutoff_len:
        blocks.pop()
    return [EncodedSample(block, list(block)) for block in blocks if block]


class EncodedDataset(torch.utils.data.Dataset):
    def __init__(self, samples: list[EncodedSample]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> EncodedSample:
        return self.samples[index]


class PaddingCollator:
    """Right-pads a list of samples into tensors; counts the samples and real tokens it batched."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.tokens_seen = 0
        self.samples_seen = 0

    def __call__(self, samples: list[EncodedSample]) -> dict[str, torch.Tensor]:
        longest = max(len(s.input_ids) for s in samples)
        self.samples_seen += len(samples)
        input_ids = torch.full((len(samples), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for row, sample in enumerate(samples):
            length = len(sample.input_ids)
            input_ids[row, :length] = torch.tensor(sample.input_ids, dtype=torch.long)
            labels[row, :length] = torch.tensor(sample.labels, dtype=torch.long)
            attention_mask[row, :length] = 1
            self.tokens_seen += length
        return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
