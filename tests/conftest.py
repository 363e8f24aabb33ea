"""The test suite's fixtures, registered once here as plugins from tests/support/:

    databases.py  a real PostgreSQL: db_url, empty_db_url, store, live_store, clock
    api_fixtures.py        the API served in the test's loop: api, ui (with the console)
    pgbouncer_fixtures.py  a real PgBouncer (transaction pooling) in front of it:
                           pgbouncer, bouncer_url
"""

pytest_plugins = ("tests.support.databases", "tests.support.api_fixtures",
                  "tests.support.pgbouncer_fixtures")

import pytest  # noqa: E402

# Helpers that assert on behalf of tests (their failures show the values).
pytest.register_assert_rewrite("tests.support.library_agents", "tests.support.old_schema")
