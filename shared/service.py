"""The shape every service's main shares: load config, connect, serve, drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from shared import tracing
from shared.bus import Bus
from shared.bus_auth import bus_credential
from shared.config import AdcConfig, ConfigError, load_config
from shared.db import create_pool, service_url
from shared.metrics_endpoint import serve_metrics


@dataclass
class ServiceContext:
    name: str
    config: AdcConfig
    bus: Bus
    pool: asyncpg.Pool | None
    stop: asyncio.Event
    args: argparse.Namespace


Serve = Callable[[ServiceContext], Awaitable[None]]


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
        asyncio.run(_main(name, config, args, serve, needs_db))
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
    logging.getLogger(name).info("started")
    try:
        await serve(ServiceContext(name, config, bus, pool, stop, args))
    finally:
        if metrics is not None:
            metrics.shutdown()
        await bus.close()
        if pool is not None:
            await pool.close()
        logging.getLogger(name).info("stopped")
