"""Issue 39: what a ledger reader may read beyond its own rows. ``accounts`` and ``users`` are
public (names that ``sacctmgr show associations`` shows every user, and what the row-level
policies look the reader up in); the ingest state and the node baselines are the cluster's
operational data, readable by no reader (migration 0008). The throwaway user logs in to the
real PostgreSQL ledger with its own gpuhpc_reader role and asks psql for each."""
from __future__ import annotations

import datetime as dt
import os
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gpuhpc.ledger import admin, db
from gpuhpc.ledger.orm import IngestState, NodeBaseline

pytestmark = pytest.mark.integration


@pytest.fixture()
def pg_url():
    admin_url = os.environ.get("GPUHPC_TEST_PG_URL")
    if not admin_url:
        pytest.fail("GPUHPC_TEST_PG_URL is not set: start PostgreSQL with `scripts/services/postgres.sh start`",
                    pytrace=False)
    name = f"gpuhpc_test_{uuid.uuid4().hex[:10]}"
    eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    db.get_engine(make_url(admin_url).set(database=name).render_as_string(hide_password=False)).dispose()
    with eng.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    eng.dispose()


def test_a_reader_reads_names_but_not_the_operational_tables(hostile, pg_url):
    db.upgrade(pg_url)
    admin.add_account("ops-acct", url=pg_url)
    admin.add_user(hostile.name, "ops-acct", url=pg_url)
    now = dt.datetime.now(dt.timezone.utc)
    with db.session_scope(pg_url) as s:
        s.add(IngestState(name="sacct", last_run_at=now, last_detail='{"jobs": 7}'))
        s.add(NodeBaseline(node="gpu-node1", name="nccl_allreduce_busbw", value=180.0, unit="GB/s", source="measured"))
    password = uuid.uuid4().hex
    sup = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with sup.connect() as c:
        c.execute(text(f'CREATE ROLE "{hostile.name}" LOGIN PASSWORD \'{password}\' IN ROLE gpuhpc_reader'))
    u = make_url(pg_url)
    dsn = f"host={u.host} port={u.port} dbname={u.database} user={hostile.name} password={password}"

    def psql(sql: str):
        return hostile.run(["psql", dsn, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])

    try:
        r = psql("SELECT a.name, u.name FROM accounts a, users u")
        assert r.returncode == 0 and r.stdout.strip() == f"ops-acct|{hostile.name}", r.stderr
        for table in ("ingest_state", "node_baselines"):
            r = psql(f"SELECT * FROM {table}")
            assert r.returncode != 0 and "permission denied" in r.stderr, (table, r.stdout, r.stderr)
            assert "sacct" not in r.stdout and "gpu-node1" not in r.stdout
    finally:
        with sup.connect() as c:
            c.execute(text(f'DROP OWNED BY "{hostile.name}"'))
            c.execute(text(f'DROP ROLE IF EXISTS "{hostile.name}"'))
        sup.dispose()
