"""A standby trainer: `python -m worker.trainer.standby --socket-fd N`, a trainer ready before its job.

The worker (worker/standby.py) launches it in a trainer's sandbox with no job's folder in view and an
environment of no job (`trainer_environment` of a job folder STANDBY_ROOT in its private /tmp). It does
what every trainer does first and no job decides: it imports torch, transformers, datasets, peft, trl and
LLaMA-Factory (seconds: most of a trainer's start). It then says `ready` on the socket the worker gave it
and waits.

The handoff is one message on that socket, which only the worker holds the other end of: the job's whole
environment (as a fresh trainer's), its config path and folder, and as SCM_RIGHTS the descriptors of its
log and events files, opened by the worker. By then the worker has put the job's folders into this
sandbox's view (worker/mounts.py). The standby then becomes the job's trainer: stdout and stderr to the
log, the environment replaced, every module constant computed at import from the standby's placeholder
folders (huggingface_hub's HF_HOME and hub cache, datasets' caches, matplotlib's config folder, in module
globals, function defaults and class attributes) re-pointed to the job's, the folder changed to the job's,
and `worker.trainer`'s main runs as a fresh trainer's does. It answers `handed` first; anything wrong
before that (a message not as the worker sends it, CUDA touched during the imports, so that the job's
CUDA_VISIBLE_DEVICES could not hold) ends the standby, and the worker starts the job fresh.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from pathlib import PurePath
from types import FunctionType

STANDBY_ROOT = "/tmp/adc-standby"  # the job folder of the standby's environment: inside its private /tmp
MAX_MESSAGE = 1 << 20
# Launched with this much room in its environment block, which the job's environment overwrites at the
# handoff: /proc/<pid>/environ (read by people, tools and tests to find a job's trainer) then shows the job's.
ENV_ROOM_KEY = "ADC_STANDBY_ENV_ROOM"
ENV_ROOM = 32 << 10


def _end_without_teardown() -> None:
    """Registered before anything is imported, so it runs last (see worker/trainer/__main__.py)."""
    main = sys.modules.get("worker.trainer.__main__")
    code = getattr(main, "_EXIT_CODE", None)
    if code is None:
        return
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


atexit.register(_end_without_teardown)
gc.disable()  # as a fresh trainer's start: training_run turns it back on before the first step


def import_everything() -> None:
    """What a trainer imports before it reads its config's consequences: the slow part of its start."""
    import datasets  # noqa: F401
    import llamafactory.hparams  # noqa: F401
    import llamafactory.train.tuner  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import worker.trainer.adc_callback  # noqa: F401
    import worker.trainer.atomic_checkpoints  # noqa: F401
    import worker.trainer.results_files  # noqa: F401
    import worker.trainer.token_count  # noqa: F401
    import worker.trainer.training_run  # noqa: F401


def import_lazy_parts() -> None:
    """What the first run would still import on first use, with no job's setting involved:
    - every model config class transformers knows: LLaMA-Factory's load_model asks whether the
      job's config is in three auto-model mappings, and `keys()` of a mapping imports all of them
      (seconds);
    - DeepSpeed, which accelerate imports to unwrap the model when it is installed (seconds), where
      the node has no GPU: it picks its accelerator at import, and on a GPU node the job's
      CUDA_VISIBLE_DEVICES decides (a fresh trainer's run imports it then)."""
    import importlib.util

    import torch
    from transformers import AutoModelForImageTextToText, AutoModelForSeq2SeqLM, AutoModelForTextToWaveform

    for auto in (AutoModelForImageTextToText, AutoModelForSeq2SeqLM, AutoModelForTextToWaveform):
        auto._model_mapping.keys()
    if importlib.util.find_spec("deepspeed") is not None and torch.cuda.device_count() == 0:
        import deepspeed  # noqa: F401


def cuda_touched() -> bool:
    """Whether the CUDA driver was loaded during the imports (it reads CUDA_VISIBLE_DEVICES once, then)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    try:
        with open("/proc/self/maps") as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:
        return True


def _moved(value, old: str, new: str):
    """`value` with the folder `old` at its start replaced by `new`; None if it does not start with it."""
    kind = type(value)
    if kind is str:
        if value == old or value.startswith(old + "/"):
            return new + value[len(old) :]
    elif issubclass(kind, PurePath):
        text = str(value)
        if text == old or text.startswith(old + "/"):
            return kind(new + text[len(old) :])
    return None


class Placeholders:
    """Where modules hold a path they computed at import from the standby's folders: module globals,
    class attributes, function defaults and closures. Found once the imports are done (while the standby waits);
    re-pointed at the handoff, which then costs only the changes."""

    def __init__(self, old: str) -> None:
        self.old = old
        self.found: list[tuple[str, object, object, str]] = []  # (kind, holder, key, where)

    def scan(self) -> Placeholders:
        old = self.old

        def held(value) -> bool:
            return _moved(value, old, old) is not None

        def defaults(fn, where: str) -> None:
            if type(fn) in (staticmethod, classmethod):
                fn = fn.__func__
            if type(fn) is not FunctionType:
                return
            if fn.__defaults__ and any(held(v) for v in fn.__defaults__):
                self.found.append(("defaults", fn, None, where))
            if fn.__kwdefaults__:
                for key, value in fn.__kwdefaults__.items():
                    if held(value):
                        self.found.append(("kwdefault", fn, key, f"{where}({key}=)"))
            for cell in fn.__closure__ or ():  # a value a decorator cached (matplotlib's get_configdir)
                try:
                    if held(cell.cell_contents):
                        self.found.append(("cell", cell, None, f"{where} closure"))
                except ValueError:  # an empty cell
                    continue

        for name, module in list(sys.modules.items()):
            try:
                items = list(vars(module).items())
            except TypeError:
                continue
            for key, value in items:
                try:
                    kind = type(value)
                    if held(value):
                        self.found.append(("attr", module, key, f"{name}.{key}"))
                    elif kind is FunctionType and value.__module__ == name:
                        defaults(value, f"{name}.{key}")
                    elif issubclass(kind, type) and value.__module__ == name:
                        for attr, member in list(vars(value).items()):
                            if held(member):
                                self.found.append(("attr", value, attr, f"{name}.{key}.{attr}"))
                            else:
                                defaults(member, f"{name}.{key}.{attr}")
                except Exception:  # noqa: BLE001, S112 - an object that refuses to be read holds no path of ours
                    continue
        return self

    def repoint(self, new: str) -> list[str]:
        """Every place found now holds `new` where it held the standby's folder; sys.path too."""
        old, done = self.old, []
        for kind, holder, key, where in self.found:
            try:
                if kind == "attr":
                    value = _moved(getattr(holder, key), old, new)
                    if value is not None:
                        setattr(holder, key, value)
                elif kind == "cell":
                    holder.cell_contents = _moved(holder.cell_contents, old, new) or holder.cell_contents
                elif kind == "defaults":
                    holder.__defaults__ = tuple(_moved(v, old, new) or v for v in holder.__defaults__)
                else:
                    value = _moved(holder.__kwdefaults__[key], old, new)
                    if value is not None:
                        holder.__kwdefaults__[key] = value
                done.append(where)
            except Exception:  # noqa: BLE001, S112 - a read-only one: left as it is
                continue
        sys.path[:] = [_moved(p, old, new) or p for p in sys.path]
        return done


class HandoffError(RuntimeError):
    """The handoff message is not what the worker sends."""


def _receive(sock):
    import array
    import json
    import socket

    fds = array.array("i")
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    if not data:
        raise HandoffError("the worker closed the standby's socket")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 2:
        raise HandoffError("the handoff message is truncated or does not carry the log and events descriptors")
    message = json.loads(data)
    env, config, folder = message.get("env"), message.get("config"), message.get("cwd")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise HandoffError("the handoff's env is not a map of strings")
    if not isinstance(config, str) or not isinstance(folder, str) or not os.path.isabs(folder):
        raise HandoffError("the handoff names no config or job folder")
    return env, config, folder, fds[0], fds[1]


def show_environment(env: dict[str, str]) -> bool:
    """Write `env` over this process's original environment block (the one /proc/self/environ shows),
    NUL-padded to its end; False (nothing written) if it does not fit. Python and the C library copied
    what they use of that block at start, and the environment was replaced by then."""
    import ctypes

    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end: proc(5) fields 50 and 51
    block = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    if start <= 0 or len(block) > end - start:
        return False
    ctypes.memmove(start, block + b"\0" * (end - start - len(block)), end - start)
    return True


def main(argv: list[str]) -> int:
    import argparse
    import json
    import socket

    parser = argparse.ArgumentParser(prog="python -m worker.trainer.standby")
    parser.add_argument("--socket-fd", type=int, required=True)
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.socket_fd)
    import_everything()
    import_lazy_parts()
    if cuda_touched():
        sock.send(json.dumps({"standby": "unusable", "why": "CUDA was initialised while importing"}).encode())
        return 1
    placeholders = Placeholders(STANDBY_ROOT).scan()
    sock.send(json.dumps({"standby": "ready"}).encode())
    env, config, folder, log_fd, events_fd = _receive(sock)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(env)
    os.environ["ADC_EVENTS_FD"] = str(events_fd)  # the descriptor as received here
    show_environment(dict(os.environ))
    os.chdir(folder)
    moved = placeholders.repoint(folder)
    sock.send(json.dumps({"standby": "handed", "repointed": len(moved)}).encode())
    sock.close()
    return run_job(config)


def run_job(config: str) -> int:
    """`worker.trainer`'s main, as `python -m worker.trainer --config <config>` would run it."""
    import importlib

    trainer_main = importlib.import_module("worker.trainer.__main__")  # its stop request reads the job's env
    atexit.unregister(trainer_main._end_without_teardown)  # this module's handler runs last instead
    sys.argv = [trainer_main.__file__, "--config", config]
    trainer_main._EXIT_CODE = trainer_main.main(["--config", config])
    return trainer_main._EXIT_CODE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
