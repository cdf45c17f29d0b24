"""credits and corrections: adjustments, an audit trail, ledger policies; charges append-only

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

* ``adjustments``: one row per credit, debit, automatic refund (a NODE_FAIL run, when the
  ``node_fail_refund`` policy is on) or rate correction (``gpuhpc ledger reprice``), with its
  reason, job, who booked it and when. Its money is booked as ``charges`` rows (kind ``adjust``,
  ``refund`` or ``correction``) pointing at it (``charges.adjustment_id``), so the quota counters,
  which are built from the charges, count it; ``charges.usage_id`` becomes NULL-able for an
  adjustment of an account rather than of a run (SQLite copies the table once for that).
* ``ledger_audit``: who changed prices, multipliers, quotas, policies and adjustments (the
  database role and the Unix user), when, the value before and after (JSON). Admins only.
* ``ledger_policies``: named switches (``node_fail_refund``), admins only.
* ``accounts.grant_code`` and ``accounts.cost_centre``: what finance books an account's cost to
  (``gpuhpc ledger account add/set --grant --cost-centre``; in the per-job line items). Plain ADD
  COLUMN, NULL-able. Readable by every reader, as the account's name and description are.
* ``charges``, ``adjustments`` and ``ledger_audit`` are append-only: a trigger refuses UPDATE and
  DELETE (and TRUNCATE on PostgreSQL) on both backends, for every role, the owner included. A
  wrong charge is corrected by another row (an adjustment), never edited.

Readers (PostgreSQL) see the adjustments of their own accounts (row-level security as the
charges'); ``ledger_audit`` and ``ledger_policies`` are in ADMIN_TABLES (no reader grant).
The downgrade drops the triggers and tables and deletes the adjustments' charges.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ADMIN_TABLES = ("ledger_audit", "ledger_policies")
MINE = ("user_name = current_user OR account_name IN (SELECT a.name FROM accounts a JOIN memberships m "
        "ON m.account_id = a.id JOIN users u ON u.id = m.user_id WHERE u.name = current_user)")
# per-user tables this migration adds, with their reader policy (as 0006's POLICIES)
POLICIES = {"adjustments": MINE}
APPEND_ONLY = ("charges", "adjustments", "ledger_audit")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)
_MONEY = sa.Numeric(precision=20, scale=6)


def _triggers_sqlite(table: str) -> list[str]:
    return [f"CREATE TRIGGER {table}_append_only_{op_.lower()} BEFORE {op_} ON {table} BEGIN "
            f"SELECT RAISE(ABORT, 'gpuhpc ledger: {table} is append-only ({op_} refused): book an adjustment "
            f"instead'); END" for op_ in ("UPDATE", "DELETE")]


PG_FUNCTION = ("CREATE OR REPLACE FUNCTION gpuhpc_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "RAISE EXCEPTION 'gpuhpc ledger: % is append-only (% refused): book an adjustment instead', "
               "TG_TABLE_NAME, TG_OP USING ERRCODE = 'integrity_constraint_violation'; END $$")


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "adjustments",
        sa.Column("id", _ID, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),          # credit | debit | refund | correction
        sa.Column("account_name", sa.String(length=64), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),     # "" for the account as a whole
        sa.Column("cluster", sa.String(length=64), nullable=True),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("gpu_hours", sa.Numeric(precision=20, scale=6), nullable=False),   # signed: credit < 0
        sa.Column("amount", _MONEY, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("bucket_at", _TS, nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adjustments")),
    )
    op.create_index("ix_adjustments_account_bucket", "adjustments", ["account_name", "bucket_at"])
    op.create_table(
        "ledger_audit",
        sa.Column("id", _ID, nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_audit")),
    )
    op.create_index("ix_ledger_audit_at", "ledger_audit", ["at"])
    op.create_table(
        "ledger_policies",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=255), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_ledger_policies")),
    )
    op.add_column("accounts", sa.Column("grant_code", sa.String(length=64), nullable=True))
    op.add_column("accounts", sa.Column("cost_centre", sa.String(length=64), nullable=True))
    with op.batch_alter_table("charges", schema=None) as batch_op:
        batch_op.alter_column("usage_id", existing_type=_ID, nullable=True)
        batch_op.add_column(sa.Column("adjustment_id", _ID, nullable=True))
        batch_op.create_foreign_key(batch_op.f("fk_charges_adjustment_id_adjustments"), "adjustments",
                                    ["adjustment_id"], ["id"])
    if pg:
        op.execute(PG_FUNCTION)
        for table in APPEND_ONLY:
            op.execute(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                       f"FOR EACH ROW EXECUTE FUNCTION gpuhpc_append_only()")
            op.execute(f"CREATE TRIGGER {table}_append_only_truncate BEFORE TRUNCATE ON {table} "
                       f"FOR EACH STATEMENT EXECUTE FUNCTION gpuhpc_append_only()")
        op.execute("GRANT SELECT, INSERT ON adjustments, ledger_audit TO gpuhpc_admin")
        op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ledger_policies TO gpuhpc_admin")
        op.execute("GRANT USAGE, SELECT ON SEQUENCE adjustments_id_seq, ledger_audit_id_seq TO gpuhpc_admin")
        op.execute("REVOKE UPDATE, DELETE, TRUNCATE ON charges, adjustments, ledger_audit FROM gpuhpc_admin")
        for table in ADMIN_TABLES:
            op.execute(f"REVOKE ALL ON {table} FROM gpuhpc_reader")
        for table, using in POLICIES.items():
            op.execute(f"GRANT SELECT ON {table} TO gpuhpc_reader")
            op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            op.execute(f"CREATE POLICY gpuhpc_admin_all ON {table} TO gpuhpc_admin USING (true) WITH CHECK (true)")
            op.execute(f"CREATE POLICY gpuhpc_reader_own ON {table} FOR SELECT TO gpuhpc_reader USING ({using})")
    else:
        for table in APPEND_ONLY:
            for sql in _triggers_sqlite(table):
                op.execute(sql)


def downgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    if pg:
        for table in APPEND_ONLY:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only_truncate ON {table}")
        op.execute("DROP FUNCTION IF EXISTS gpuhpc_append_only()")
        op.execute("GRANT UPDATE, DELETE ON charges TO gpuhpc_admin")
    else:
        for table in APPEND_ONLY:
            for op_ in ("update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only_{op_}")
    op.execute("DELETE FROM charges WHERE adjustment_id IS NOT NULL OR usage_id IS NULL")
    with op.batch_alter_table("charges", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_charges_adjustment_id_adjustments"), type_="foreignkey")
        batch_op.drop_column("adjustment_id")
        batch_op.alter_column("usage_id", existing_type=_ID, nullable=False)
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("cost_centre")
        batch_op.drop_column("grant_code")
    op.drop_table("ledger_policies")
    op.drop_index("ix_ledger_audit_at", table_name="ledger_audit")
    op.drop_table("ledger_audit")
    op.drop_index("ix_adjustments_account_bucket", table_name="adjustments")
    op.drop_table("adjustments")
