"""Alembic environment, run programmatically by ``gpuhpc.ledger.db.upgrade``."""
from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gpuhpc.ledger.orm import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # a batch migration copies a table and drops the old one: with foreign keys on, that
            # DROP would cascade into the rows that reference it (before any transaction begins:
            # SQLite ignores this pragma inside one)
            connection.connection.dbapi_connection.execute("PRAGMA foreign_keys=OFF")
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=True, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
        if connection.dialect.name == "sqlite":
            connection.connection.dbapi_connection.execute("PRAGMA foreign_keys=ON")


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
