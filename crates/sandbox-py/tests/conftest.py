"""Fixtures for the sandboxio conformance runs: the asyncio event loop, the canary server
and the end-of-run leak check every engine class shares."""

from __future__ import annotations

import pytest

from engines import close_canary, leftovers


@pytest.fixture
def anyio_backend() -> str:
    # pyo3's bridge drives asyncio; trio is not supported by the native module.
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def no_container_outlives_the_run():
    """Every container this run created is gone at its end (both adapters')."""
    yield
    close_canary()
    left = leftovers()
    assert not left, f"containers outlived the run: {left}"
