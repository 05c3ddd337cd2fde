"""Run the executor: python -m services.executor."""

from services.executor.executor import Executor
from shared.infra.service import ServiceContext, base_parser, run_service


async def serve(ctx: ServiceContext) -> None:
    await Executor(ctx.bus, ctx.pool, ctx.config).run(ctx.stop)


if __name__ == "__main__":
    run_service("executor", base_parser("adc-executor", "Carries ADC's decisions out and owns job status"), serve)
