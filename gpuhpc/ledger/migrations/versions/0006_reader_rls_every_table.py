"""ledger roles (PostgreSQL): row-level security on every per-user table, no blanket reader grants

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

0004 let gpuhpc_reader SELECT every table (and, by default privileges, every future one) while
row-level security covered charges, usage_records and reservations only: a reader saw other
users' sweep specs (with their ``env``), trials, metrics, utilisation, quotas and memberships.
Now the reader is granted SELECT table by table: the shared reference tables in PUBLIC_TABLES,
and the per-user tables in POLICIES, each with row-level security and a reader policy (its own
rows, or its accounts' for billing rows, as 0004's). A table a later migration adds is not
readable by gpuhpc_reader until that migration grants it (the default privilege is gone);
``tests/unit/ledger/test_ledger_rls_tables.py`` fails when a table is in neither list.
Nothing to do on SQLite (the file's owner and mode are its access control).
"""
from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# readable by every reader: names and the price book (what sacctmgr and the docs show anyway)
PUBLIC_TABLES = ("alembic_version", "accounts", "users", "gpu_prices", "price_multipliers", "ingest_state",
                 "node_baselines")
_MY_ACCOUNT_IDS = ("SELECT m.account_id FROM memberships m JOIN users u ON u.id = m.user_id "
                   "WHERE u.name = current_user")
# the reader policy of each per-user table. A subquery on another RLS table is filtered by that
# table's own policy (it runs as the reader), so children follow their parents.
POLICIES = {
    # 0004's: own rows and the rows of the accounts the ledger lists the reader in
    "charges": None, "usage_records": None, "reservations": None,
    "reservation_holds": "reservation_id IN (SELECT id FROM reservations)",
    "memberships": "user_id IN (SELECT id FROM users WHERE name = current_user)",
    "quotas": f"account_id IN ({_MY_ACCOUNT_IDS})",
    "quota_usage": "quota_id IN (SELECT id FROM quotas)",
    "sweeps": "user_name = current_user",
    "sweep_chunks": "sweep_id IN (SELECT id FROM sweeps)",
    "sweep_trials": "sweep_id IN (SELECT id FROM sweeps)",
    "job_metrics": "(cluster, job_id, array_task_id) IN (SELECT cluster, job_id, array_task_id FROM usage_records)",
    "run_utilisation": "usage_id IN (SELECT id FROM usage_records)",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM gpuhpc_reader")
    op.execute("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM gpuhpc_reader")
    op.execute("REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM gpuhpc_reader")
    for table in PUBLIC_TABLES:
        op.execute(f"GRANT SELECT ON {table} TO gpuhpc_reader")
    for table, using in POLICIES.items():
        op.execute(f"GRANT SELECT ON {table} TO gpuhpc_reader")
        if using is None:          # 0004 set these up
            continue
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")     # the owner (migrations) is exempt
        op.execute(f"CREATE POLICY gpuhpc_admin_all ON {table} TO gpuhpc_admin USING (true) WITH CHECK (true)")
        op.execute(f"CREATE POLICY gpuhpc_reader_own ON {table} FOR SELECT TO gpuhpc_reader USING ({using})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, using in POLICIES.items():
        if using is None:
            continue
        op.execute(f"DROP POLICY IF EXISTS gpuhpc_reader_own ON {table}")
        op.execute(f"DROP POLICY IF EXISTS gpuhpc_admin_all ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO gpuhpc_reader")
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO gpuhpc_reader")
