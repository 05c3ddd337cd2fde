"""Run the API: python -m services.api [--config FILE] [--host H] [--port P]."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from services.api.app import create_app
from shared.infra import tracing
from shared.infra.config import load_config


def main() -> None:
    parser = argparse.ArgumentParser(prog="adc-api", description="ADC REST API")
    parser.add_argument("--config", help="adc_config.yaml (default: $ADC_CONFIG or the repo's)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    config = load_config(args.config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s api %(levelname)s %(message)s")
    tracing.setup("api")
    uvicorn.run(
        create_app(config),
        host=args.host or config.api.host,
        port=args.port if args.port is not None else config.api.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        loop="shared.infra.service:new_api_loop",  # every service's loop is chosen there
    )


if __name__ == "__main__":
    main()
