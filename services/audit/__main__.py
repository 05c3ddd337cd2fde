"""Run the audit sink: python -m services.audit."""

from services.audit.sink import run_sink
from shared.infra.audit_chain import load_chain_key
from shared.infra.service import ServiceContext, base_parser, run_service


async def serve(ctx: ServiceContext) -> None:
    key_file = ctx.config.audit.chain_key_file
    await run_sink(ctx.bus, ctx.pool, ctx.stop, load_chain_key(key_file) if key_file else None)


if __name__ == "__main__":
    run_service("audit-sink", base_parser("adc-audit-sink", "Writes ADC_AUDIT into Postgres"), serve)
