"""The `api` and `ui` fixtures (a pytest plugin, registered in
tests/conftest.py): the API of tests/support/api.py on the test's database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.api import CONSOLE_SECRET, Api, serve_api


@pytest.fixture
async def ui(db_url: str) -> AsyncIterator[Api]:
    """The API with its console, sessions signed with CONSOLE_SECRET."""
    async with serve_api(db_url, console_secret=CONSOLE_SECRET) as served:
        yield served


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Api]:
    """The API on this test's database, with the tenants of TOKENS and an admin."""
    async with serve_api(db_url) as served:
        yield served
