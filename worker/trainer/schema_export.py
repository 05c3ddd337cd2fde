"""Export LLaMA-Factory's own argument definitions as JSON, for validation without importing it.

    .venv-trainer/bin/python -m worker.trainer.schema_export --out shared/llamafactory_schema.json

Run by scripts/install.sh in the trainer's environment. The api validates a job's `train`
section against this file (shared/train_spec.py), so what is accepted is exactly what
`llamafactory-cli train` parses: the fields of its argument dataclasses (model, data, training,
fine-tuning, generation), their types and choices, its template registry and the column and tag
names its dataset registry (`dataset_info.json`) understands. Nothing here is a hand-kept list.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import sys
import types
import typing
from pathlib import Path

_NONE = type(None)


def _kind(annotation) -> dict:
    """A JSON description of one field's type: kind, choices, nullable."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not _NONE]
        nullable = len(members) < len(typing.get_args(annotation))
        kinds = [_kind(m) for m in members]
        if len(kinds) == 1:
            return {**kinds[0], "nullable": nullable or kinds[0].get("nullable", False)}
        names = {k["kind"] for k in kinds}
        if names == {"int", "float"}:
            return {"kind": "float", "nullable": nullable}
        if names == {"choice", "str"}:
            # `SchedulerType | str` and the like: the string is converted to the enum, so only its values pass
            choices = [c for k in kinds for c in k.get("choices", ())]
            return {"kind": "choice", "choices": choices, "nullable": nullable}
        # e.g. `dict | str` (a mapping or a JSON string / file), `bool | str` ("all", "no", true)
        return {"kind": "any", "accepts": sorted(names), "nullable": nullable}
    if origin is typing.Literal:
        return {"kind": "choice", "choices": list(typing.get_args(annotation))}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"kind": "choice", "choices": [m.value for m in annotation]}
    if annotation is bool:
        return {"kind": "bool"}
    if annotation is int:
        return {"kind": "int"}
    if annotation is float:
        return {"kind": "float"}
    if annotation is str:
        return {"kind": "str"}
    if origin in (list, tuple) or annotation in (list, tuple):
        return {"kind": "list"}
    if origin is dict or annotation is dict:
        return {"kind": "dict"}
    return {"kind": "any"}


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = field.default_factory()  # type: ignore[misc]
    else:
        return None
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def argument_fields() -> dict[str, dict]:
    from llamafactory.hparams.parser import _TRAIN_ARGS

    fields: dict[str, dict] = {}
    for dataclass in _TRAIN_ARGS:
        hints = typing.get_type_hints(dataclass)
        for field in dataclasses.fields(dataclass):
            if not field.init or field.name in fields:
                continue
            entry = _kind(hints.get(field.name, typing.Any))
            entry["default"] = _default(field)
            entry["group"] = dataclass.__name__
            fields[field.name] = entry
    return fields


def dataset_attributes() -> dict[str, list[str]]:
    from llamafactory.data.parser import DatasetAttr

    hints = typing.get_type_hints(DatasetAttr)
    tags = [f.name for f in dataclasses.fields(DatasetAttr) if f.name.endswith("_tag") and f.name != "kto_tag"]
    columns = [
        f.name
        for f in dataclasses.fields(DatasetAttr)
        if f.name not in tags
        and f.name
        not in ("load_from", "dataset_name", "formatting", "ranking", "subset", "split", "folder", "num_samples")
    ]
    return {"formatting": list(typing.get_args(hints["formatting"])), "columns": columns, "tags": tags}


def export() -> dict:
    import llamafactory
    from llamafactory.data.template import TEMPLATES

    return {
        "llamafactory_version": llamafactory.__version__,
        "fields": argument_fields(),
        "templates": sorted(TEMPLATES),
        # Templates whose multimodal plugin needs the model's processor, even for text-only data
        # (LLaMA-Factory's mm_plugin: "Processor was not found" for a folder without one).
        "processor_templates": sorted(
            name for name, t in TEMPLATES.items() if getattr(t.mm_plugin, "image_token", None) is not None
        ),
        "dataset": dataset_attributes(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.trainer.schema_export", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    schema = export()
    out = Path(args.out)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out)
    print(
        f"{out}: {len(schema['fields'])} keys, {len(schema['templates'])} templates "
        f"(LLaMA-Factory {schema['llamafactory_version']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
