"""train.yaml → LLaMA-Factory's arguments (a dict for `run_exp`) and ADC's own few keys.

The YAML is read the way `llamafactory-cli train FILE` reads it (OmegaConf, so `1e-4` is a
number), and LLaMA-Factory parses and checks every key itself. ADC's keys (`adc_*`) are taken
out first: LLaMA-Factory would refuse them as unknown.
"""

from __future__ import annotations

from pathlib import Path

# ADC's keys in a train section, and what they mean (see batch_geometry.py).
ADC_KEYS = {
    "adc_global_batch_size": "keep this global batch at any world size",
    # Set only by the api's export endpoint: the section then holds LLaMA-Factory's export keys.
    "adc_export_of": "the job whose LoRA output this job merges into its base model (export.py)",
    # Set from the spec's `serve: true`: the section then holds LLaMA-Factory's inference keys.
    "adc_serve": "serve LLaMA-Factory's OpenAI-style chat API on the worker's socket (serve.py)",
}


class ConfigError(ValueError):
    """A problem with what the job asked for; `errors` lists each with the key it concerns."""

    def __init__(self, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or [{"loc": ["train"], "msg": message}]


def is_export(args: dict) -> bool:
    """A LLaMA-Factory export config (`llamafactory-cli export`): `export_dir` set and nothing to train,
    evaluate or predict (the api's rule too: shared/specs/train_spec.py `is_export`)."""
    return bool(args.get("export_dir")) and not any(args.get(k) for k in ("do_train", "do_eval", "do_predict"))


def key_error(key: str, message: str) -> ConfigError:
    return ConfigError(
        f"{key}: {message}" if not message.startswith(key) else message, [{"loc": ["train", key], "msg": message}]
    )


def load_train_args(config_path: str | Path) -> tuple[dict, dict]:
    """(LLaMA-Factory arguments, ADC keys) of a train.yaml; a whole job spec is accepted too."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(config_path).resolve()
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path))
    except (OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if isinstance(raw, dict) and isinstance(raw.get("train"), dict):
        raw = raw["train"]
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of LLaMA-Factory keys")
    adc = {key: raw.pop(key) for key in list(raw) if key in ADC_KEYS}
    unknown_adc = [key for key in raw if isinstance(key, str) and key.startswith("adc_")]
    if unknown_adc:
        raise key_error(unknown_adc[0], f"unknown ADC key {unknown_adc[0]!r}; ADC's keys: {', '.join(ADC_KEYS)}")
    return raw, adc
