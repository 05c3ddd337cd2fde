"""Config parsing: typed, strict, every problem at once, env overrides."""

import pytest

from shared.infra.config import ConfigError, load_config, parse_config


def test_repo_config_loads_with_seed_values():
    cfg = load_config(env={})
    assert cfg.controller.interval == 5
    assert cfg.strategies.oom_protection.threshold_memory_usage == 0.92
    assert [lv.name for lv in cfg.strategies.priority_scheduling.levels] == ["high", "low"]
    assert cfg.strategies.priority_scheduling.default == "low"
    assert cfg.strategies.priority_scheduling.rank("high") == 0


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "controller": {"interval": "soon", "bogus": 1},
                "api": {"port": 70000},
                "strategies": {"oom_protection": {"threshold_memory_usage": 1.5}},
            },
            env={},
        )
    problems = err.value.problems
    assert len(problems) == 4
    joined = "\n".join(problems)
    for field in (
        "controller.interval",
        "controller.bogus",
        "api.port",
        "strategies.oom_protection.threshold_memory_usage",
    ):
        assert field in joined


def test_priority_levels_must_be_unique_and_default_known():
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"strategies": {"priority_scheduling": {"levels": [{"name": "a"}, {"name": "a"}]}}}, env={})
    with pytest.raises(ConfigError, match="default_level"):
        parse_config({"strategies": {"priority_scheduling": {"levels": [{"name": "a"}], "default_level": "b"}}}, env={})


def test_environment_overrides_urls():
    cfg = parse_config({}, env={"NATS_URL": "nats://elsewhere:4222", "DATABASE_URL": "postgresql://db/x"})
    assert cfg.bus.url == "nats://elsewhere:4222"
    assert cfg.database.url == "postgresql://db/x"


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("controller: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, env={})


def test_max_gpus_per_node_is_read_at_submission():
    from shared.specs.job_spec import SpecError, validate_job

    config = parse_config({"controller": {"max_gpus_per_node": 4}}, env={})
    with pytest.raises(SpecError) as err:
        validate_job({"name": "big", "gpus": 6, "train": {}}, config)
    assert any(e["loc"] == ["gpus"] and "max_gpus_per_node (4)" in e["msg"] for e in err.value.errors)
    with pytest.raises(SpecError) as err:  # spread over nodes it may be that big (the train section is still checked)
        validate_job({"name": "big", "gpus": 6, "multi_node": True, "train": {}}, config)
    assert not any(e["loc"] == ["gpus"] for e in err.value.errors)


def test_controller_oom_retries_is_read_as_the_oom_retry_rules_budget():
    cfg = parse_config({"controller": {"oom_retries": 5}, "strategies": {"oom_retry": {"memory_margin": 1.5}}}, env={})
    assert cfg.strategies.oom_retry.max_retries == 5 and cfg.strategies.oom_retry.memory_margin == 1.5
    assert "oom_retries" not in cfg.controller.model_dump()
    assert load_config(env={}).strategies.oom_retry.max_retries == 2
    assert parse_config({"controller": {"oom_retries": 3}, "strategies": {"oom_retry": {"max_retries": 3}}}, env={})


def test_controller_oom_retries_disagreeing_with_the_rules_budget_is_refused_naming_both():
    with pytest.raises(ConfigError) as err:
        parse_config({"controller": {"oom_retries": 1}, "strategies": {"oom_retry": {"max_retries": 4}}}, env={})
    [problem] = err.value.problems
    assert "controller.oom_retries (1)" in problem and "strategies.oom_retry.max_retries (4)" in problem
