"""Fixtures for the sweeps integration tests: a private data dir (sweep database, sweep
directories, logs), the ledger off unless a test opts in, a fast driver, and cleanup: every
sweep a test starts is cancelled at the end (its own array jobs and driver, by id); a private
PostgreSQL server a test may stop and start (``private_pg``)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient


@pytest.fixture
def slurm() -> SlurmClient:
    return SlurmClient()


@pytest.fixture
def sweep_env(tmp_path, monkeypatch) -> Path:
    from ledger_helpers import private_data_dir

    data = private_data_dir(tmp_path, monkeypatch, "GPUHPC_LOG_DIR", "GPUHPC_CHECKPOINT_ROOT", "GPUHPC_DB_URL",
                            "GPUHPC_SWEEP_ROOT")
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "2")
    return data


@pytest.fixture
def sweeps(slurm):
    """Register sweep ids; each is cancelled (driver and arrays) at the end."""
    ids: list[int] = []
    yield ids.append
    from gpuhpc.sweeps import control

    for sid in ids:
        try:
            control.cancel(sid, client=slurm)
        except Exception:           # the test's own data dir may be gone: nothing to cancel then
            pass


@pytest.fixture
def track(slurm):
    ids: list[str] = []
    yield ids.append
    for job_id in ids:
        slurm.run(["scancel", str(job_id)], check=False)


@pytest.fixture
def pg_sweep_db(sweep_env, monkeypatch):
    """A fresh PostgreSQL database at head as the gpuhpc database (GPUHPC_DB_URL), dropped after."""
    import os
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from gpuhpc.ledger import db

    admin = os.environ.get("GPUHPC_TEST_PG_URL")
    if not admin:
        pytest.fail("GPUHPC_TEST_PG_URL is not set (scripts/services/postgres.sh start)", pytrace=False)
    name = f"gpuhpc_sweep_{uuid.uuid4().hex[:10]}"
    eng = create_engine(admin, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin).set(database=name).render_as_string(hide_password=False)
    db.upgrade(url)
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    yield url
    db.get_engine(url).dispose()
    with eng.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    eng.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_pg(sweep_env, monkeypatch):
    """A PostgreSQL server of the test's own (scripts/services/postgres.sh with its own data
    dir, free port and password file) at head as the gpuhpc database: restarting it disturbs
    no other test. Yields (url, pg) where ``pg("stop")``/``pg("start")`` drive the server."""
    from gpuhpc.ledger import db

    # not under pytest's 0700 base: the server runs as the postgres user and must reach it
    d = Path(tempfile.mkdtemp(prefix="gpuhpc-pg-"))
    env = {**os.environ, "D": str(d), "PORT": str(_free_port()), "PGPASSFILE": str(d / "pgpass")}

    def pg(cmd: str) -> str:
        script = Path(__file__).resolve().parents[3] / "scripts/services/postgres.sh"
        res = subprocess.run(["bash", str(script), cmd], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (cmd, res.stdout, res.stderr)
        return res.stdout

    try:
        url = pg("start").strip().splitlines()[-1]
        db.upgrade(url)
        monkeypatch.setenv("GPUHPC_DB_URL", url)
        yield url, pg
        db.get_engine(url).dispose()
    finally:
        pg("wipe")
        shutil.rmtree(d, ignore_errors=True)
