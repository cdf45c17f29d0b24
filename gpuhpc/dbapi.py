"""Plain DB-API access to the gpuhpc database (the ledger's, which also holds the sweep
tables): ``sqlite3`` or ``psycopg``, no SQLAlchemy, so the submit paths (``gpuhpc submit``,
``gpuhpc sweep run``) pay for the standard library only on the embedded SQLite database.

:class:`Connection` opens one (SQLite: WAL, busy timeout, every transaction ``BEGIN
IMMEDIATE``; PostgreSQL: READ COMMITTED) and :class:`Tx` is one transaction on it with the
dialects' differences (parameter style, ``FOR UPDATE``, how numbers and times are stored: the
values SQLAlchemy's dialects write and read, so both layers share the tables). The ledger's
connection (:class:`gpuhpc.ledger.quota.Connection`) adds its schema check.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from gpuhpc.errors import LedgerError

SQLITE_BUSY_TIMEOUT_MS = 60_000
UTC = dt.timezone.utc


class Tx:
    """An open transaction on a DB-API connection, with the dialect's differences: the
    parameter style, ``FOR UPDATE``, and how numbers and times are stored."""

    def __init__(self, conn: Any, dialect: str) -> None:
        if dialect not in ("sqlite", "postgresql"):
            raise LedgerError(f"the ledger supports SQLite and PostgreSQL, not {dialect}")
        self.conn = conn
        self.pg = dialect == "postgresql"
        self.for_update = " FOR UPDATE" if self.pg else ""   # SQLite: BEGIN IMMEDIATE locks already
        self.cur = conn.cursor()

    def execute(self, sql: str, params: tuple | list = ()) -> Any:
        """Run ``sql`` (``?`` placeholders, whatever the dialect); returns the cursor."""
        self.cur.execute(sql.replace("?", "%s") if self.pg else sql, params)
        return self.cur

    def execute_many(self, sql: str, rows: list) -> None:
        """Run ``sql`` (``?`` placeholders) once per row of ``rows``."""
        self.cur.executemany(sql.replace("?", "%s") if self.pg else sql, rows)

    def one(self, sql: str, params: tuple | list = ()) -> tuple | None:
        return self.execute(sql, params).fetchone()

    def insert(self, sql: str, params: tuple | list) -> int:
        """An INSERT; returns the new row's id (the database assigns it)."""
        if self.pg:
            return self.execute(sql + " RETURNING id", params).fetchone()[0]
        return self.execute(sql, params).lastrowid

    # values
    @staticmethod
    def _same(d: Decimal) -> Decimal:
        return d

    @property
    def num(self):
        """Decimal -> the bound form: numeric on PostgreSQL, ``float`` on SQLite (as SQLAlchemy binds it)."""
        return self._same if self.pg else float

    def dec(self, v: Any) -> Decimal:
        if v is None:
            raise LedgerError("a NULL where the ledger keeps a number")
        if isinstance(v, Decimal):
            return v
        return Decimal("%.6f" % v) if isinstance(v, (int, float)) else Decimal(str(v))

    def ts(self, d: dt.datetime) -> Any:
        d = d.astimezone(UTC)
        return d if self.pg else d.isoformat(" ", "microseconds")[:26]     # YYYY-MM-DD HH:MM:SS.ffffff

    def parse_ts(self, v: Any) -> dt.datetime:
        if not isinstance(v, dt.datetime):
            v = dt.datetime.fromisoformat(v)
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)


def redact(url: str) -> str:
    """``url`` without its password."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def sqlite_file(url: str) -> str:
    """The file of a ``sqlite:///FILE`` URL."""
    path = url.split("://", 1)[1].split("?", 1)[0]
    path = path[1:] if path.startswith("/") else path
    if not path or path == ":memory:":
        raise LedgerError(f"{url}: the ledger needs a database file, not an in-memory SQLite database")
    return path


class Connection:
    """An open connection to the database at ``url``: SQLite (WAL, busy timeout, every
    transaction ``BEGIN IMMEDIATE``) or PostgreSQL (psycopg, READ COMMITTED). ``check`` (the
    transaction, the URL) runs in the first transaction (a schema check); a PostgreSQL server
    it cannot reach raises ``unreachable``. Keeping one open for several transactions saves
    SQLite a checkpoint and an fsync each (each last close of a WAL database checkpoints)."""

    def __init__(self, url: str, *, check: Callable[[Tx, str], None] | None = None,
                 unreachable: type[LedgerError] = LedgerError) -> None:
        self.url = url
        self.check = check
        self.checked = check is None
        if url.startswith("sqlite:"):
            import sqlite3

            path = sqlite_file(url)
            if not os.path.isfile(path):     # never create an empty file where a ledger was expected
                raise LedgerError(f"the ledger database {path} does not exist: run `gpuhpc db upgrade`")
            self.dialect = "sqlite"
            self.conn = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            # db.get_engine's connection set-up
            for pragma in ("journal_mode=WAL", f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}", "foreign_keys=ON",
                           "synchronous=NORMAL"):
                self.conn.execute(f"PRAGMA {pragma}")
        elif url.startswith("postgresql"):
            import psycopg

            self.dialect = "postgresql"
            try:
                self.conn = psycopg.connect(re.sub(r"^postgresql\+\w+://", "postgresql://", url))
            except psycopg.OperationalError as exc:
                raise unreachable(f"cannot connect to the ledger database {redact(url)}: "
                                  f"{str(exc).strip().splitlines()[-1]}") from None
        else:
            raise LedgerError(f"the ledger supports SQLite and PostgreSQL, not {redact(url)}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        """One committed transaction, rolled back on any error."""
        sqlite = self.dialect == "sqlite"
        if sqlite:
            self.conn.execute("BEGIN IMMEDIATE")     # concurrent writers queue here
        try:
            tx = Tx(self.conn, self.dialect)
            if not self.checked:
                self.check(tx, self.url)
                self.checked = True
            yield tx
            if sqlite:
                self.conn.execute("COMMIT")
            else:
                self.conn.commit()
        finally:
            if sqlite:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
            else:
                self.conn.rollback()

    def close(self) -> None:
        self.conn.close()
