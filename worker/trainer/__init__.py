"""ADC's trainer: `python -m worker.trainer --config train.yaml` (see README.md).

Kept import-light on purpose: the worker imports exit codes, events and checkpoint helpers
from here without paying for torch.
"""
