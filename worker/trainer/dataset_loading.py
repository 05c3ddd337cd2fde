"""Datasets named in the train section, read from dataset_dir and put in one shape.

Names resolve through `dataset_info.json` (LLaMA-Factory's registry) in dataset_dir. Two
formats are understood, with the registry's `columns` and `tags` mappings:

- alpaca: prompt (instruction) + query (input) as the user turn, response (output), optional
  system, history ([[user, assistant], ...]) and tools columns.
- sharegpt: a messages column of {role_tag: ..., content_tag: ...} turns whose role values are
  named by the tags (human/gpt/observation/function_call/system by default).

Every record becomes a `Conversation`. For stage pt a record is plain text (the prompt column,
then the response if the format has one). `max_samples` keeps the first n records of each
dataset, as LLaMA-Factory does; several datasets are concatenated in the order given.

Pure Python: no torch, so it is cheap to test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.train_spec import load_dataset_registry

ALPACA_COLUMNS = {
    "prompt": "instruction", "query": "input", "response": "output",
    "history": "history", "system": "system", "tools": "tools",
}
SHAREGPT_COLUMNS = {"messages": "conversations", "system": "system", "tools": "tools"}
SHAREGPT_TAGS = {
    "role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
    "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system",
}
# Turns that the model reads (prompt side) and turns that it learns to write (response side).
PROMPT_ROLES = ("user", "observation")
RESPONSE_ROLES = ("assistant", "function")


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the dataset."""


@dataclass
class Conversation:
    turns: list[tuple[str, str]]  # (role, content), roles from PROMPT_ROLES / RESPONSE_ROLES, alternating
    system: str = ""
    tools: str = ""


@dataclass
class LoadedData:
    conversations: list[Conversation] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # dataset name -> malformed records skipped


def _read_records(path: Path) -> list[Any]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl")) if path.is_dir() else [path]
    records: list[Any] = []
    for file in files:
        text = file.read_text(encoding="utf-8")
        if file.suffix == ".jsonl":
            records.extend(json.loads(line) for line in text.splitlines() if line.strip())
        else:
            data = json.loads(text)
            records.extend(data if isinstance(data, list) else [data])
    return records


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _alpaca_conversation(record: dict, columns: dict) -> Conversation | None:
    prompt = _text(record.get(columns["prompt"]))
    query = _text(record.get(columns["query"]))
    response = record.get(columns["response"])
    user = "\n".join(part for part in (prompt, query) if part)
    if not user or not isinstance(response, str) or not response:
        return None
    turns: list[tuple[str, str]] = []
    for pair in record.get(columns["history"]) or []:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            return None
        turns += [("user", _text(pair[0])), ("assistant", _text(pair[1]))]
    turns += [("user", user), ("assistant", response)]
    return Conversation(turns, system=_text(record.get(columns["system"])), tools=_text(record.get(columns["tools"])))


def _sharegpt_conversation(record: dict, columns: dict, tags: dict) -> Conversation | None:
    messages = record.get(columns["messages"])
    if not isinstance(messages, list) or not messages:
        return None
    roles = {
        tags["user_tag"]: "user", tags["assistant_tag"]: "assistant", tags["observation_tag"]: "observation",
        tags["function_tag"]: "function", tags["system_tag"]: "system",
    }
    system = _text(record.get(columns["system"]))
    turns: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return None
        role = roles.get(message.get(tags["role_tag"]))
        content = _text(message.get(tags["content_tag"]))
        if role == "system" and index == 0 and not system:
            system = content
            continue
        expected = PROMPT_ROLES if len(turns) % 2 == 0 else RESPONSE_ROLES
        if role not in expected:
            return None
        turns.append((role, content))
    if len(turns) < 2 or len(turns) % 2:
        return None
    return Conversation(turns, system=system, tools=_text(record.get(columns["tools"])))


def _plain_text(record: dict, formatting: str, columns: dict, tags: dict) -> str | None:
    if formatting == "alpaca":
        parts = [_text(record.get(columns[name])) for name in ("prompt", "query", "response")]
        text = "\n".join(p for p in parts if p)
    else:
        conversation = _sharegpt_conversation(record, columns, tags)
        text = "\n".join(content for _, content in conversation.turns) if conversation else ""
    return text or None


def load_datasets(
    names: list[str], dataset_dir: str | Path, stage: str, max_samples: int | None = None
) -> LoadedData:
    dataset_dir = Path(dataset_dir)
    try:
        registry = load_dataset_registry(dataset_dir)
    except FileNotFoundError as exc:
        raise DatasetError(f"dataset_dir {str(dataset_dir)!r} has no dataset_info.json") from exc
    loaded = LoadedData()
    for name in names:
        entry = registry.get(name)
        if not isinstance(entry, dict) or "file_name" not in entry:
            raise DatasetError(f"dataset {name!r} is not registered with a local file_name in {dataset_dir}")
        formatting = entry.get("formatting", "alpaca")
        defaults = ALPACA_COLUMNS if formatting == "alpaca" else SHAREGPT_COLUMNS
        columns = {**defaults, **(entry.get("columns") or {})}
        tags = {**SHAREGPT_TAGS, **(entry.get("tags") or {})}
        try:
            records = _read_records(dataset_dir / entry["file_name"])
        except (OSError, json.JSONDecodeError) as exc:
            raise DatasetError(f"dataset {name!r}: cannot read {entry['file_name']!r}: {exc}") from exc
        if max_samples is not None:
            records = records[:max_samples]
        dropped = 0
        for record in records:
            if not isinstance(record, dict):
                dropped += 1
                continue
            if stage == "pt":
                item = _plain_text(record, formatting, columns, tags)
                target = loaded.texts
            elif formatting == "alpaca":
                item = _alpaca_conversation(record, columns)
                target = loaded.conversations
            else:
                item = _sharegpt_conversation(record, columns, tags)
                target = loaded.conversations
            if item is None:
                dropped += 1
            else:
                target.append(item)
        if dropped:
            loaded.dropped[name] = dropped
        if dropped == len(records):
            what = "text" if stage == "pt" else f"{formatting} conversations (prompt and response)"
            raise DatasetError(f"dataset {name!r} has no usable records for stage {stage}: expected {what}")
    return loaded
