"""Run the decider: python -m services.decider."""

import sys

from services.decider.engine import DeciderEngine
from shared.infra.service import ServiceContext, base_parser, run_service

# A pass's rules run in a thread beside the event loop. When the loop has work (a sample, an urgent
# pass's Postgres answer), CPython makes it wait for the rule thread to drop the GIL for up to the
# switch interval, 5 ms by default, at every such hand-over: 1 ms keeps an urgent pass beside a
# regular pass's rules from paying that many times over, for a few more hand-overs in the rule thread.
GIL_SWITCH_INTERVAL_S = 0.001


async def serve(ctx: ServiceContext) -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    # The config file is watched for changes: the same one run_service loaded.
    await DeciderEngine(ctx.bus, ctx.pool, ctx.config, config_path=ctx.args.config).run(ctx.stop)


if __name__ == "__main__":
    run_service("decider", base_parser("adc-decider", "Turns telemetry and the queue into decisions"), serve)
