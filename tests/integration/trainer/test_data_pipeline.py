"""Datasets → conversations → prompt text → token ids and labels, on the real fixtures."""

from __future__ import annotations

import json

import pytest

from shared.train_spec import SUPPORTED_TEMPLATES
from tests.integration.trainer.trainer_process import EXAMPLE_DATA
from worker.trainer.dataset_loading import Conversation, DatasetError, load_datasets
from worker.trainer.prompt_templates import (
    TEMPLATES,
    ChatTemplateRenderer,
    TemplateError,
    get_template,
    select_renderer,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_alpaca_records_become_single_exchanges():
    data = load_datasets(["alpaca_en_demo"], EXAMPLE_DATA, "sft")
    source = json.loads((EXAMPLE_DATA / "alpaca_en_demo.json").read_text())
    assert len(data.conversations) == len(source) == 64
    with_input = next(i for i, r in enumerate(source) if r["input"])
    role, content = data.conversations[with_input].turns[0]
    assert role == "user" and content == source[with_input]["instruction"] + "\n" + source[with_input]["input"]
    assert data.conversations[with_input].turns[1] == ("assistant", source[with_input]["output"])


def test_sharegpt_tool_calls_keep_their_roles_and_tools():
    data = load_datasets(["glaive_toolcall_en_demo"], EXAMPLE_DATA, "sft")
    assert len(data.conversations) + sum(data.dropped.values()) == 32
    roles = {role for conversation in data.conversations for role, _ in conversation.turns}
    assert roles == {"user", "assistant", "function", "observation"}
    assert all(conversation.tools for conversation in data.conversations)


def test_several_datasets_concatenate_in_order_with_max_samples_each():
    data = load_datasets(["identity", "alpaca_en_demo"], EXAMPLE_DATA, "sft", max_samples=5)
    identity = json.loads((EXAMPLE_DATA / "identity.json").read_text())
    alpaca = json.loads((EXAMPLE_DATA / "alpaca_en_demo.json").read_text())
    assert len(data.conversations) == 10
    assert data.conversations[0].turns[0][1] == identity[0]["instruction"]
    assert data.conversations[5].turns[0][1].startswith(alpaca[0]["instruction"])


def test_column_and_tag_mappings_and_malformed_records(tmp_path):
    records = [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "assistant", "content": "starts wrong"}, {"role": "user", "content": "x"}]},
        {"messages": [{"role": "user", "content": "dangling"}]},
    ]
    (tmp_path / "chat.json").write_text(json.dumps(records))
    (tmp_path / "qa.jsonl").write_text(json.dumps({"q": "2+2?", "a": "4", "h": [["1+1?", "2"]]}) + "\n")
    (tmp_path / "dataset_info.json").write_text(json.dumps({
        "chat": {"file_name": "chat.json", "formatting": "sharegpt", "columns": {"messages": "messages"},
                 "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                          "assistant_tag": "assistant", "system_tag": "system"}},
        "qa": {"file_name": "qa.jsonl", "columns": {"prompt": "q", "response": "a", "history": "h"}},
    }))
    data = load_datasets(["chat", "qa"], tmp_path, "sft")
    assert data.dropped == {"chat": 2}
    chat, qa = data.conversations
    assert chat.system == "be brief" and chat.turns == [("user", "hi"), ("assistant", "hello")]
    assert qa.turns == [("user", "1+1?"), ("assistant", "2"), ("user", "2+2?"), ("assistant", "4")]


def test_plain_text_for_pretraining_and_refusal_of_text_for_sft():
    data = load_datasets(["c4_demo"], EXAMPLE_DATA, "pt", max_samples=3)
    first = json.loads((EXAMPLE_DATA / "c4_demo.jsonl").read_text().splitlines()[0])["text"]
    assert len(data.texts) == 3 and data.texts[0] == first
    with pytest.raises(DatasetError, match="'c4_demo' has no usable records for stage sft"):
        load_datasets(["c4_demo"], EXAMPLE_DATA, "sft")


def test_template_registry_matches_what_the_spec_accepts():
    assert set(TEMPLATES) == set(SUPPORTED_TEMPLATES)
    with pytest.raises(TemplateError, match="supported: alpaca, default"):
        get_template("vicuna")


def test_named_templates_render_exchanges():
    conversation = Conversation([("user", "Hi"), ("assistant", "Hello"), ("user", "Bye"), ("assistant", "Later")],
                                system="Be kind.")
    exchanges = get_template("qwen3_nothink").render(conversation, eos="<eos>")
    assert exchanges == [
        ("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
         "Hello<|im_end|>\n"),
        ("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", "Later<|im_end|>\n"),
    ]
    llama3 = get_template("llama3").render(conversation, eos="<eos>")
    assert llama3[0][0].startswith("<|begin_of_text|><|start_header_id|>system")
    assert llama3[0][1] == "Hello<|eot_id|>"
    alpaca = get_template("alpaca").render(Conversation([("user", "Sum 1+1"), ("assistant", "2")]), eos="</s>")
    assert alpaca[0] == ("Below is an instruction that describes a task. Write a response that appropriately "
                         "completes the request.\n\n### Instruction:\nSum 1+1\n\n### Response:\n", "2</s>\n\n")
    assert get_template("empty").render(Conversation([("user", "a"), ("assistant", "b")]), eos="E") == [("a", "bE")]


def test_tokenizer_chat_template_is_split_into_prompt_and_response(tokenizer):
    renderer = select_renderer(None, tokenizer)
    assert isinstance(renderer, ChatTemplateRenderer)
    conversation = Conversation([("user", "Hi"), ("assistant", "Hello"), ("user", "Bye"), ("assistant", "Later")])
    exchanges = renderer.render(conversation, eos="")
    full = tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in conversation.turns], tokenize=False)
    assert "".join(p + r for p, r in exchanges) == full
    assert exchanges[0] == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "Hello<|im_end|>\n")
