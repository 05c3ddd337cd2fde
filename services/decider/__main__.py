"""Run the decider: python -m services.decider."""
from services.decider.engine import DeciderEngine
from shared.service import ServiceContext, base_parser, run_service


async def serve(ctx: ServiceContext) -> None:
    # The config file is watched for changes: the same one run_service loaded.
    await DeciderEngine(ctx.bus, ctx.pool, ctx.config, config_path=ctx.args.config).run(ctx.stop)


if __name__ == "__main__":
    run_service("decider", base_parser("adc-decider", "Turns telemetry and the queue into decisions"), serve)
