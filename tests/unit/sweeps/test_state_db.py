"""Sweep state on a shared filesystem (issue 21, point 6): a driver that may run on another
host needs a server database; SQLite is refused in one line before anything is written."""
from __future__ import annotations

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps.submission import check_state_db


def test_sqlite_with_a_driver_on_another_host_is_refused():
    with pytest.raises(UserInputError) as e:
        check_state_db("sqlite:////home/u/.local/share/gpuhpc/ledger.db", lambda: ["127.0.0.1", "10.255.0.99"])
    assert e.value.field == "GPUHPC_DB_URL" and "10.255.0.99" in e.value.message
    assert "\n" not in e.value.one_line() and "PostgreSQL" in e.value.one_line()


def test_sqlite_on_this_host_and_a_server_database_are_fine():
    check_state_db("sqlite:////var/tmp/x/ledger.db", lambda: ["127.0.0.1", "localhost"])
    asked = []
    check_state_db("postgresql+psycopg://u@db/gpuhpc", lambda: asked.append(1) or ["10.255.0.99"])
    assert asked == []                  # a server database: nodes not even asked
