"""A spec's shape is bounded before any per-key check (shared/specs/spec_bounds.py): the first bound passed is
named, what fits is untouched, and the check looks at no more values than the bound allows."""

from __future__ import annotations

import pytest

from shared.infra.config import SpecLimits, parse_config
from shared.specs.job_spec import SpecError, parse_document, validate_job
from shared.specs.spec_bounds import shape_problems

LIMITS = SpecLimits()


def _one(doc) -> dict:
    [problem] = shape_problems(doc, LIMITS)
    return problem


@pytest.mark.parametrize(
    "doc, loc, says",
    [
        ({"train": {f"k{i}": 1 for i in range(LIMITS.max_keys + 1)}}, ["train"], "max_keys"),
        ({"train": {"deepspeed": {"a": {"b": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}}}}, None, "max_depth"),
        ({"train": {"x" * (LIMITS.max_key_chars + 1): 1}}, None, "max_key_chars"),
        ({"name": "n", "train": {"max_steps": 10**400}}, ["train", "max_steps"], "outside 64 bits"),
        ({"name": "n", "train": {"\ud800": 1}}, ["train", "\\ud800"], "lone UTF-16 surrogate (U+D800)"),
        ({"name": ["ok", "bad\udfff"]}, ["name", 1], "lone UTF-16 surrogate (U+DFFF)"),
        ({"items": list(range(LIMITS.max_values + 1))}, ["body"], "max_values"),
    ],
)
def test_the_first_bound_passed_is_named(doc, loc, says):
    problem = _one(doc)
    assert says in problem["msg"], problem
    if loc is not None:
        assert problem["loc"] == loc, problem


def test_a_spec_within_the_bounds_passes_untouched():
    doc = {
        "name": "ok",
        "gpus": 2,
        "train": {
            "max_steps": 2**62,
            "learning_rate": 1e-4,
            "deepspeed": {"zero_optimization": {"stage": 2}},
            "dataset": "a,b",
            "lora_target": ["q_proj", "v_proj"],
        },
    }
    assert shape_problems(doc, LIMITS) == []


def test_yaml_stops_parsing_at_the_value_bound():
    text = "train:\n" + "".join(f"  k{i}: 1\n" for i in range(LIMITS.max_values))
    with pytest.raises(SpecError) as err:
        parse_document(text, "application/yaml")
    assert "too many YAML nodes" in str(err.value)


def test_validate_job_bounds_the_shape_before_reading_the_train_section():
    # Far more near-miss keys than any spec has: refused by their count, with no per-key message at all.
    config = parse_config({}, env={})
    doc = {"name": "h", "train": {f"learning_rat{i}": 1 for i in range(40_000)}}
    with pytest.raises(SpecError) as err:
        validate_job(doc, config)
    assert len(err.value.errors) == 1 and "max_keys" in err.value.errors[0]["msg"], err.value.errors
