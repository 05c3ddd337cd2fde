"""The shape every service's main shares: load config, connect, serve, drain on SIGTERM; and the
event loop each service runs on (`loop_factory`), chosen here for every entrypoint."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from shared.infra import tracing
from shared.infra.bus import Bus
from shared.infra.bus_auth import bus_credential
from shared.infra.config import AdcConfig, ConfigError, load_config
from shared.infra.db import create_pool, service_url
from shared.infra.metrics_endpoint import serve_metrics


@dataclass
class ServiceContext:
    name: str
    config: AdcConfig
    bus: Bus
    pool: asyncpg.Pool | None
    stop: asyncio.Event
    args: argparse.Namespace


Serve = Callable[[ServiceContext], Awaitable[None]]

# Services that stay on asyncio's own loop. The worker spawns the trainers (hostile code), and uvloop's
# subprocess spawn does not honour `close_fds`: every inheritable descriptor the worker holds would
# reach the trainer (tests/security/test_event_loops.py); nor has it `user`/`group` (docs/security.md).
ASYNCIO_LOOP_ONLY = frozenset({"worker"})


def _uvloop():
    try:
        import uvloop
    except ImportError:  # an optional speed-up: asyncio's loop does the same, slower
        return None
    return uvloop


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop service `name` runs on: uvloop's where it is installed, else asyncio's. Every bus
    connection is TLS (shared/infra/bus_tls.py); asyncio runs TLS through its pure-Python SSL protocol, a few
    Python calls per message, where uvloop's transport, sockets and loop are C. The worker stays on
    asyncio's (ASYNCIO_LOOP_ONLY)."""
    uvloop = None if name in ASYNCIO_LOOP_ONLY else _uvloop()
    return asyncio.new_event_loop if uvloop is None else uvloop.new_event_loop


def run_loop(name: str, main: Awaitable):
    """Run `main` to completion on the loop of service `name` (what asyncio.run does, on that loop)."""
    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(main)


def new_api_loop() -> asyncio.AbstractEventLoop:
    """A new loop for the api, as uvicorn makes it (`loop="shared.infra.service:new_api_loop"`); it names
    itself in the log once it runs, as every other service's does in its "started" line."""
    loop = loop_factory("api")()
    loop.call_soon(lambda: logging.getLogger("api").info("event loop: %s", running_loop_name()))
    return loop


def running_loop_name() -> str:
    """The running loop's class, by module: `uvloop.Loop` or `asyncio.unix_events._UnixSelectorEventLoop`."""
    loop = type(asyncio.get_running_loop())
    return f"{loop.__module__}.{loop.__qualname__}"


def base_parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=name, description=description)
    parser.add_argument("--config", help="adc_config.yaml (default: $ADC_CONFIG or the repo's)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def run_service(name: str, parser: argparse.ArgumentParser, serve: Serve, *, needs_db: bool = True) -> None:
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as err:
        parser.exit(2, f"{name}: {err}\n")
    tracing.setup(name)
    try:
        run_loop(name, _main(name, config, args, serve, needs_db))
    except ConfigError as err:
        parser.exit(2, f"{name}: {err}\n")


async def _main(name: str, config: AdcConfig, args: argparse.Namespace, serve: Serve, needs_db: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    role = f"{name}-{args.node}" if getattr(args, "node", None) else name  # worker-<node>, collector-<node>
    bus = await Bus.connect(config.bus.url, config.bus.prefix, name, bus_credential(config, role))
    pool = (
        await create_pool(
            service_url(config.database.url, name, config.database.passwords_dir),
            config.database.pool_min,
            config.database.pool_max,
        )
        if needs_db
        else None
    )
    metrics = serve_metrics(config, name)
    logging.getLogger(name).info("started; event loop: %s", running_loop_name())
    try:
        await serve(ServiceContext(name, config, bus, pool, stop, args))
    finally:
        if metrics is not None:
            metrics.shutdown()
        await bus.close()
        if pool is not None:
            await pool.close()
        logging.getLogger(name).info("stopped")
