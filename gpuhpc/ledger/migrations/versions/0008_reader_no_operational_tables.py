"""ledger roles (PostgreSQL): the ingest state and the node baselines are no reader's to read

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

0006 left ``ingest_state`` (when the ingest and sync-slurm last ran, with their detail) and
``node_baselines`` (each node's measured all-reduce bandwidth) readable by every gpuhpc_reader.
Both are the cluster's operational data, used only by the admin's commands (ingest, sync-slurm,
the deep health checks): gpuhpc_reader loses SELECT on them (ADMIN_TABLES, as 0007's
instance_usage). ``accounts`` and ``users`` stay readable by every reader: they hold names that
``sacctmgr show associations`` shows every user anyway, and the row-level-security policies of
the per-user tables look the reader up in them. Nothing to do on SQLite.
"""
from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ADMIN_TABLES = ("ingest_state", "node_baselines")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in ADMIN_TABLES:
        op.execute(f"REVOKE ALL ON {table} FROM gpuhpc_reader")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in ADMIN_TABLES:
        op.execute(f"GRANT SELECT ON {table} TO gpuhpc_reader")
