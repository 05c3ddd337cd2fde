"""Shared pieces of the simulation tests: a small real trace (see fixtures/README.md)."""

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def small_trace() -> Path:
    return FIXTURES / "itp_cluster02_first300.csv"
