"""Engines, ``session_scope()`` and programmatic Alembic migrations.

SQLite (the embedded default) is opened in WAL mode with a busy timeout, and every
transaction starts with ``BEGIN IMMEDIATE`` (the SQLAlchemy pysqlite recipe: the driver's
own transaction handling is switched off with ``isolation_level=None``). Without that,
pysqlite's deferred transactions let concurrent writers lose updates silently.

PostgreSQL (``GPUHPC_DB_URL=postgresql+psycopg://...``) runs READ COMMITTED; the quota code
serialises on the quota rows with ``SELECT ... FOR UPDATE``.
"""
from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from gpuhpc.errors import LedgerError
from gpuhpc.ledger import paths
# the schema head (kept in sync with migrations/versions, a unit test checks it; lets every
# command check the schema without loading Alembic) and the busy timeout live with the quota
# decision (DB-API, no SQLAlchemy), which needs them too
from gpuhpc.ledger import quota
from gpuhpc.ledger.quota import KNOWN_REVISIONS, SCHEMA_HEAD, SQLITE_BUSY_TIMEOUT_MS  # noqa: F401

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for another database or an in-memory one."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


@functools.cache
def get_engine(url: str | None = None) -> Engine:
    url = url or paths.db_url()
    if url.startswith("sqlite"):
        f = sqlite_file(url)
        if f is not None:
            f.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                                                  "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _rec):  # noqa: ANN001
            dbapi_conn.isolation_level = None   # we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):  # noqa: ANN001
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql"):
        return create_engine(url, pool_pre_ping=True)
    return create_engine(url)


@functools.cache
def _sessionmaker(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        try:
            row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
        except Exception:
            return None
        finally:
            conn.rollback()
    return row[0] if row else None


_checked: set[str] = set()


def check_schema(url: str | None = None) -> None:
    """Raise LedgerError unless the database is at the migration head."""
    url = url or paths.db_url()
    if url in _checked:
        return
    problem = quota.schema_problem(current_revision(get_engine(url)), _redact(url))
    if problem:
        raise LedgerError(problem)
    _checked.add(url)


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@contextlib.contextmanager
def session_scope(url: str | None = None, *, check: bool = True) -> Iterator[Session]:
    """A session that commits on success, rolls back on error and always closes."""
    url = url or paths.db_url()
    if check:
        check_schema(url)
    session = _sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["engine"] = get_engine(url)
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database to ``revision``; returns (before, after)."""
    from alembic import command

    url = url or paths.db_url()
    engine = get_engine(url)
    before = current_revision(engine)
    command.upgrade(alembic_config(url), revision)
    _checked.discard(url)
    f = sqlite_file(url)
    if f is not None and f.exists() and f.stat().st_uid == os.geteuid():
        os.chmod(f, 0o600)      # only its owner (the admin) may read or change the ledger
    return before, current_revision(engine)


def downgrade(url: str | None, revision: str) -> None:
    from alembic import command

    url = url or paths.db_url()
    command.downgrade(alembic_config(url), revision)
    _checked.discard(url)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
