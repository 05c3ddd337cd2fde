"""A serving job: LLaMA-Factory's OpenAI-style API (`llamafactory-cli api`: `create_app` over its
`ChatModel`) on a socket the worker made, inside the trainer's sandbox.

The sandbox has no network of its own (loopback only, nothing reaches it), so the server listens on no
port: the worker binds a UNIX socket in its own attempt folder (one the trainer cannot write, so it
cannot swap the socket for another), listens, and hands the listening descriptor down
(`ADC_SERVE_FD`); uvicorn accepts on it (`fd=`). The worker relays the api's chat completion requests
to that socket (worker/serving/relay.py).

A serving job never finishes: it answers until it is cancelled (SIGTERM) or stopped. A checkpoint-stop
(preemption, a drain, the worker's shutdown) ends it with `stopped` and exit 75 with nothing saved; its
next attempt loads the model again and answers on that attempt's socket.
"""

from __future__ import annotations

import gc
import os
import threading

from worker.trainer.events import EventWriter
from worker.trainer.exit_codes import ExitCode
from worker.trainer.job_config import ConfigError, key_error
from worker.trainer.stop_request import StopRequest

SERVE_FD_ENV = "ADC_SERVE_FD"
# Keys the worker adds to every train.yaml, which LLaMA-Factory's inference arguments do not take.
_WORKER_KEYS = ("output_dir", "resume_from_checkpoint")
STOP_POLL_S = 0.2
GRACEFUL_S = 5  # a request still generating when a stop comes gets this long to finish


def inference_arguments(args: dict) -> dict:
    """LLaMA-Factory's inference arguments (`get_infer_args`) of a serving job's train.yaml."""
    return {k: v for k, v in args.items() if k not in _WORKER_KEYS}


def listening_fd() -> int:
    raw = os.environ.get(SERVE_FD_ENV, "")
    if not raw.isdigit():
        raise ConfigError(f"a serving job needs the worker's listening socket ({SERVE_FD_ENV}); none was given")
    return int(raw)


def run_serve(args: dict, events: EventWriter, stop_request: StopRequest) -> ExitCode:
    fd = listening_fd()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import uvicorn
    from llamafactory.api.app import create_app
    from llamafactory.chat import ChatModel

    try:
        chat_model = ChatModel(inference_arguments(args))
    except (
        ValueError,
        ImportError,
        OSError,
    ) as exc:  # LLaMA-Factory's refusal of the arguments, a model it cannot load
        raise key_error("model_name_or_path", f"LLaMA-Factory cannot serve this model: {exc}") from None
    gc.freeze()  # the collector back on (__main__ turns it off while the trainer gets ready), as training_run's
    gc.enable()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(chat_model),
            fd=fd,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_S,
        )
    )
    stopped = threading.Event()

    def watch() -> None:
        while not server.should_exit:
            if stop_request.requested_locally():
                stopped.set()
                server.should_exit = True
                return
            threading.Event().wait(STOP_POLL_S)

    threading.Thread(target=watch, name="adc-serve-stop", daemon=True).start()
    # Requests that come before uvicorn accepts wait in the socket's backlog: the job answers from now on.
    events.emit("started", max_steps=0, world_size=1, resumed_from=None, step=0, serving=True)
    server.run()  # SIGTERM (a cancel): uvicorn shuts down, then raises the signal again, which ends the process
    if stopped.is_set():
        events.emit("stopped", step=0, checkpoint=None, serving=True)
        return ExitCode.STOPPED_AFTER_CHECKPOINT
    events.emit("failed", error="the server ended without a stop request")
    return ExitCode.FAILED
