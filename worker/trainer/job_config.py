"""The trainer's settings: train.yaml, validated by shared/train_spec.py, with defaults filled.

The worker writes train.yaml already validated; the trainer validates again because it may
be run by hand, and because the files it names (model, datasets) must exist on this node.
Relative paths resolve against the YAML's folder (the job folder).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from shared.train_spec import TrainSpecError, defaults, validate_train_spec


class ConfigError(ValueError):
    """A problem with what the job asked for; `errors` lists each with the key it concerns."""

    def __init__(self, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or [{"loc": ["train"], "msg": message}]


def key_error(key: str, message: str) -> ConfigError:
    return ConfigError(f"{key}: {message}" if not message.startswith(key) else message,
                       [{"loc": ["train", key], "msg": message}])


def load_settings(config_path: str | Path) -> dict:
    path = Path(config_path).resolve()
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if isinstance(raw, dict) and isinstance(raw.get("train"), dict):
        raw = raw["train"]  # a whole job spec is accepted too
    try:
        normalized = validate_train_spec(raw if raw is not None else {}, base_dir=path.parent)
    except TrainSpecError as exc:
        raise ConfigError(str(exc), exc.errors) from None
    settings = {**defaults(), **normalized}
    if "output_dir" not in normalized:
        settings["output_dir"] = str(path.parent / settings["output_dir"])
    return settings
