"""The worker's request to checkpoint and stop, and the agreement of all ranks on it.

A request is either the file named by ADC_STOP_FILE existing, or SIGUSR1 delivered to any
rank. Ranks see a request at different moments, so at every optimizer-step boundary they
all-reduce the flag (MAX): all ranks then stop at the same step, and the checkpoint they
write together is consistent. A single-rank run skips the collective.

SIGTERM is left alone: it means "terminate now", and Python's default action does that.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

STOP_FILE_ENV = "ADC_STOP_FILE"


class StopRequest:
    def __init__(self, stop_file: str | os.PathLike | None) -> None:
        self.stop_file = Path(stop_file) if stop_file else None
        self._signalled = False
        self._agreed = False

    @classmethod
    def from_environment(cls) -> StopRequest:
        return cls(os.environ.get(STOP_FILE_ENV) or None)

    def install_signal_handler(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        # Only set a flag: the stop itself must happen at a step boundary, not mid-backward.
        self._signalled = True

    def requested_locally(self) -> bool:
        if self._signalled:
            return True
        return self.stop_file is not None and self.stop_file.exists()

    def agreed(self, world_size: int, device=None) -> bool:
        """True on every rank once any rank has seen a request. Collective when world_size > 1:
        every rank must call it at the same step."""
        if self._agreed:
            return True
        local = self.requested_locally()
        if world_size > 1:
            import torch
            import torch.distributed as dist

            flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            local = bool(flag.item())
        self._agreed = local
        return local
