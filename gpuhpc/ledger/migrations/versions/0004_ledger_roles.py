"""ledger roles (PostgreSQL): gpuhpc_admin may change the ledger, gpuhpc_reader may only read it

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Both are NOLOGIN group roles (cluster-wide, created once); a site grants them to login roles:
``GRANT gpuhpc_admin TO ledger_admin`` for the controller's credential (the gpuhpc_ledger role
installs it readable by root only), ``GRANT gpuhpc_reader TO alice`` for users who query
reports with their own credential. Row-level security on charges, usage_records and
reservations: a reader sees its own rows (``user_name = current_user``) and those of the
accounts the ledger lists it in; an admin sees all. Nothing to do on SQLite: the file's owner and mode (0600,
``gpuhpc db upgrade``) are its access control.
"""
from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ROLES = ("gpuhpc_admin", "gpuhpc_reader")
# row-level security for readers: a login role named like the Unix user (peer authentication on the
# ledger host, or one role per user) sees its own rows and those of the accounts the ledger lists it in
PER_USER_TABLES = ("charges", "usage_records", "reservations")
MINE = ("user_name = current_user OR account_name IN (SELECT a.name FROM accounts a JOIN memberships m "
        "ON m.account_id = a.id JOIN users u ON u.id = m.user_id WHERE u.name = current_user)")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for role in ROLES:
        op.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN "
                   f"CREATE ROLE {role} NOLOGIN; END IF; END $$")
    op.execute("GRANT USAGE ON SCHEMA public TO gpuhpc_admin, gpuhpc_reader")
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO gpuhpc_admin")
    op.execute("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO gpuhpc_admin")
    op.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO gpuhpc_reader")
    op.execute("REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public FROM gpuhpc_reader")
    # tables a later migration creates get the same grants (from the role that runs migrations)
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO gpuhpc_admin")
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO gpuhpc_admin")
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO gpuhpc_reader")
    for table in PER_USER_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")     # the owner (migrations) is exempt
        op.execute(f"CREATE POLICY gpuhpc_admin_all ON {table} TO gpuhpc_admin USING (true) WITH CHECK (true)")
        op.execute(f"CREATE POLICY gpuhpc_reader_own ON {table} FOR SELECT TO gpuhpc_reader USING ({MINE})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in PER_USER_TABLES:
        op.execute(f"DROP POLICY IF EXISTS gpuhpc_reader_own ON {table}")
        op.execute(f"DROP POLICY IF EXISTS gpuhpc_admin_all ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM gpuhpc_admin, gpuhpc_reader")
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM gpuhpc_admin")
    op.execute("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM gpuhpc_admin, gpuhpc_reader")
    op.execute("REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM gpuhpc_admin")
    op.execute("REVOKE USAGE ON SCHEMA public FROM gpuhpc_admin, gpuhpc_reader")
    # the roles themselves stay: other ledger databases on the server may use them
