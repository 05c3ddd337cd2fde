"""The tokenized-dataset cache's key and entries, and the warm trainer's go file (no trainer run)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from worker.trainer.tokenized_cache import CACHE_ENV, TokenizedCache, cache_key
from worker.trainer.warm_start import MAX_GO_BYTES, GoError, wait_for_go


@pytest.fixture
def job(tmp_path) -> dict:
    data, model = tmp_path / "data", tmp_path / "model"
    data.mkdir()
    model.mkdir()
    (data / "dataset_info.json").write_text(
        json.dumps({"mine": {"file_name": "mine.json"}, "hub": {"hf_hub_url": "x"}})
    )
    (data / "mine.json").write_text('[{"instruction": "a", "output": "b"}]')
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_text("weights")
    return {
        "model_name_or_path": str(model),
        "dataset": "mine",
        "dataset_dir": str(data),
        "template": "qwen3_nothink",
        "cutoff_len": 64,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "max_steps": 10,
    }


def test_the_key_ignores_what_changes_only_training_and_follows_what_changes_tokens(job, tmp_path):
    key = cache_key(job)
    assert key is not None
    # A resize, a smaller micro-batch, a resume, more steps: the same tokens.
    same = job | {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "max_steps": 20}
    assert cache_key(same | {"resume_from_checkpoint": "/x/checkpoint-4", "learning_rate": 1.0}) == key
    assert cache_key(job | {"cutoff_len": 128}) != key
    assert cache_key(job | {"template": "llama3"}) != key
    assert cache_key(job | {"seed": 3}) != key  # the eval split depends on it
    (tmp_path / "model" / "model.safetensors").write_text("other weights, same tokenizer")
    assert cache_key(job) == key
    (tmp_path / "data" / "mine.json").write_text('[{"instruction": "a longer one", "output": "b"}]')
    assert cache_key(job) != key
    key = cache_key(job)
    (tmp_path / "model" / "tokenizer.json").write_text('{"changed": true}')
    assert cache_key(job) != key


def test_no_key_for_data_it_cannot_fingerprint(job):
    assert cache_key(job | {"dataset": "hub"}) is None
    assert cache_key(job | {"dataset": "unknown"}) is None
    assert cache_key(job | {"dataset_dir": "/nonexistent"}) is None


def test_an_entry_is_staged_then_published_and_loaded_from_then_on(job, tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert TokenizedCache.for_run(job) is None  # no cache named by the worker
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert TokenizedCache.for_run(job | {"tokenized_path": "/mine"}) is None  # the job's own choice
    assert TokenizedCache.for_run(job | {"streaming": True}) is None
    first = TokenizedCache.for_run(job)
    assert first.staging is not None and first.tokenized_path == str(first.staging)
    first.staging.mkdir(parents=True)
    (first.staging / "dataset_dict.json").write_text("{}")  # what LLaMA-Factory would save
    first.publish()
    assert (first.final / "dataset_dict.json").is_file() and not first.staging.parent.exists()
    again = TokenizedCache.for_run(job)
    assert again.staging is None and again.tokenized_path == str(first.final)


def test_a_half_written_entry_is_never_loaded(job, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    killed = TokenizedCache.for_run(job)
    killed.staging.mkdir(parents=True)
    (killed.staging / "data-00000-of-00001.arrow").write_text("half")  # killed before publish
    assert TokenizedCache.for_run(job).staging is not None


def test_the_go_file_is_waited_for_and_read(tmp_path):
    go = tmp_path / "go"
    writer = threading.Timer(0.2, lambda: go.write_text(json.dumps({"resume_from": "/job/output/checkpoint-7"})))
    writer.start()
    began = time.monotonic()
    assert wait_for_go(go, poll_s=0.01) == "/job/output/checkpoint-7"
    assert time.monotonic() - began >= 0.15
    go.write_text(json.dumps({"resume_from": None}))
    assert wait_for_go(go) is None


@pytest.mark.parametrize(
    "content,why",
    [
        (b"[]", "not a JSON object"),
        (b'{"resume_from": 3}', "resume_from must be"),
        (b"{not json", "is not JSON"),
        (b" " * (MAX_GO_BYTES + 1), "larger than"),
    ],
)
def test_a_go_file_not_as_the_worker_writes_it_is_refused(tmp_path, content, why):
    go = tmp_path / "go"
    go.write_bytes(content)
    with pytest.raises(GoError, match=why):
        wait_for_go(go)
    os.unlink(go)
