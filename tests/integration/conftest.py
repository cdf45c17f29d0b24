"""Fixtures every integration area may use: ``pg_url``, a fresh PostgreSQL database on the server
CI starts with scripts/services/postgres.sh (``GPUHPC_TEST_PG_URL``), dropped afterwards."""
from __future__ import annotations

import os
import uuid

import pytest


def _pg_admin_url() -> str:
    url = os.environ.get("GPUHPC_TEST_PG_URL")
    if not url:
        pytest.fail("GPUHPC_TEST_PG_URL is not set: start PostgreSQL with `scripts/services/postgres.sh start` "
                    "and export the URL it prints", pytrace=False)
    return url


@pytest.fixture()
def pg_url():
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = _pg_admin_url()
    name = f"gpuhpc_test_{uuid.uuid4().hex[:10]}"
    eng = create_engine(admin, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin).set(database=name).render_as_string(hide_password=False)
    yield url
    from gpuhpc.ledger import db

    try:
        db.get_engine(url).dispose()
    except Exception:
        pass
    with eng.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    eng.dispose()
