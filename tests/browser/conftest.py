"""Headless Chromium (Debian's package) driven by Playwright against a live stack.

Nothing downloads a browser: Playwright launches /usr/bin/chromium. Without it the browser
tests are skipped, except in CI (CI=true), where they fail: scripts/install.sh installs it.
Screenshots go to $ADC_TEST_ARTIFACTS/browser, else to a folder under the session's tmp path;
the session prints the folder. One stack per module: a browser test stack is expensive.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from services.api.auth import create_token
from shared.infra.db import connect
from tests.e2e.conftest import running_stack

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    if os.environ.get("ADC_TEST_ARTIFACTS"):
        folder = Path(os.environ["ADC_TEST_ARTIFACTS"]) / "browser"
        folder.mkdir(parents=True, exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("browser-screenshots", numbered=False)
    print(f"\nbrowser screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser(live, team_tokens):
    # Playwright's sync API runs an event loop in this thread until closed: what needs asyncio.run
    # (the stack, the tokens) is made before it starts and torn down after it stops.
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("CI needs /usr/bin/chromium for the browser tests (scripts/install.sh installs it)")
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Two nodes of two simulated GPUs each (the trainers run on CPU); a simulated GPU carries the
    load of the trainer holding it (memory: its resident memory, utilization: its CPU use)."""
    # comm_jitter off: a lone trainer on two busy cores jitters far beyond the seed's threshold.
    yield from running_stack(
        tmp_path_factory,
        workers=2,
        controller={"timeout": 30},
        simulate_gpus=2,
        strategies={"comm_jitter": {"enabled": False}},
    )


@pytest.fixture(scope="module")
def team_tokens(live) -> dict[str, str]:
    """A user of team alpha and one of team beta."""

    async def make() -> dict[str, str]:
        conn = await connect(live.env.database_url)
        try:
            return {team: (await create_token(conn, f"{team}-user", "user", team))[1] for team in ("alpha", "beta")}
        finally:
            await conn.close()

    return asyncio.run(make())
