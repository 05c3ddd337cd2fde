"""The policies compared: each is ADC's config with strategy overrides, run by the same decider code.

- fifo: static reservation, the seeds' "traditional" way: admission in priority order, FIFO
  within a level, with backfill; nothing running is ever preempted, moved or resized.
- las: Tiresias-style two-queue discretized least attained service (1 GPU-hour threshold),
  preemptive inside a level; higher levels still preempt lower ones (priority_scheduling);
  no migration, no elasticity.
- adc: the policy set as shipped in adc_config.yaml (or --config).
- adc-no-migration, adc-no-elastic, adc-no-aggregation: adc with one capability switched off.
- adc-bandit: adc with the bandit choosing placements (`bandit.mode: active`); adc-bandit-shadow:
  adc deciding, the bandit choosing beside it and learning, never acting (`bandit.mode: shadow`).
"""

from __future__ import annotations

from typing import Any

from shared.infra.config import AdcConfig, merge_sections

OFF = {"enabled": False}
_STATIC = {
    "priority_scheduling": OFF,
    "defragmentation": OFF,
    "elastic_scale": OFF,
    "oom_protection": OFF,
    "comm_jitter": OFF,
    "load_balance": OFF,
    "consolidate": OFF,
}
OVERRIDES: dict[str, dict[str, Any]] = {
    "fifo": {"strategies": _STATIC | {"queue_order": {"enabled": True, "method": "fifo"}}},
    "las": {
        "strategies": _STATIC
        | {
            "priority_scheduling": {"enabled": True},
            "queue_order": {"enabled": True, "method": "las", "las_thresholds_gpu_s": [3600.0]},
        }
    },
    "adc": {},
    "adc-no-migration": {
        "strategies": {
            "defragmentation": OFF,
            "comm_jitter": OFF,
            "load_balance": OFF,
            "consolidate": OFF,
            "oom_protection": {"action": "checkpoint_requeue"},
        }
    },
    "adc-no-elastic": {"controller": {"enable_auto_scale": False}, "strategies": {"elastic_scale": OFF}},
    "adc-no-aggregation": {"strategies": {"priority_fifo": {"aggregate_fragments": False}}},
    # adc with the learned placement policy (services/decider/bandit) acting, or only watching.
    "adc-bandit": {"bandit": {"mode": "active"}},
    "adc-bandit-shadow": {"bandit": {"mode": "shadow"}},
}
LEARNED = ("adc-bandit", "adc-bandit-shadow")  # asked for by name: not among the policies run by default
DEFAULT_POLICIES = [name for name in OVERRIDES if name not in LEARNED]


def policy_config(base: AdcConfig, name: str) -> AdcConfig:
    if name not in OVERRIDES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(OVERRIDES)}")
    data = base.model_dump()
    for section, overlay in OVERRIDES[name].items():
        data[section] = (
            merge_sections(data[section], overlay) if section == "strategies" else {**data[section], **overlay}
        )
    return AdcConfig.model_validate(data)
