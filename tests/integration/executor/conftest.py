import pytest
import pytest_asyncio

from tests.conftest import Isolated
from tests.integration.executor.harness import Harness


@pytest.fixture(scope="module")
def env():
    e = Isolated().open()
    yield e
    e.close()


@pytest_asyncio.fixture(scope="module")
async def ex(env):
    async with Harness(env) as harness:
        yield harness
