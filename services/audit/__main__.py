"""Run the audit sink: python -m services.audit."""
from services.audit.sink import run_sink
from shared.service import ServiceContext, base_parser, run_service


async def serve(ctx: ServiceContext) -> None:
    await run_sink(ctx.bus, ctx.pool, ctx.stop)


if __name__ == "__main__":
    run_service("audit-sink", base_parser("adc-audit-sink", "Writes ADC_AUDIT into Postgres"), serve)
