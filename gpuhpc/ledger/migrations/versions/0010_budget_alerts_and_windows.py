"""budget alerts to PIs (contacts, thresholds, what was sent); quota periods that are allocation windows

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

* ``alert_contacts``: one row per account, where its budget alerts go (``gpuhpc ledger account set
  --contact``): ``mailto:pi@example.org`` or an ``https://`` webhook. A webhook URL often carries a
  secret token, so the table is admins only (ADMIN_TABLES), not a column of ``accounts`` (which
  every reader reads).
* ``quotas.alert_at``: the quota's thresholds in percent of its budget, comma-separated (NULL: the
  default ``80,100``; ``''``: no alerts), ``gpuhpc quota set --alert-at``. Plain ADD COLUMN.
* ``quota_alerts``: one row per (quota, period start, measure, threshold) that was due: claimed
  before the mail or POST goes out (the unique key makes a second cron run skip it), then marked
  sent or failed (a failed one is tried again on the next run). Admins only.
* Quota periods: besides ``day``, ``week``, ``month`` and ``total``, ``quotas.period`` (VARCHAR(16)
  since 0001, no CHECK) may hold an allocation window ``2026-07-01/P12M`` or ``2026-01-05/P90D``
  (:mod:`gpuhpc.ledger.periods`). No column changes for that; the downgrade refuses while such a
  quota exists (an older gpuhpc cannot read it): set those quotas to a calendar period first.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

ADMIN_TABLES = ("alert_contacts", "quota_alerts")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)
_NUM = sa.Numeric(precision=20, scale=6)
CALENDAR = ("day", "week", "month", "total")


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "alert_contacts",
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("contact", sa.String(length=1024), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_alert_contacts_account_id_accounts"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_alert_contacts")),
    )
    op.create_table(
        "quota_alerts",
        sa.Column("id", _ID, nullable=False),
        sa.Column("quota_id", sa.Integer(), nullable=False),
        sa.Column("period_start", _TS, nullable=False),
        sa.Column("measure", sa.String(length=16), nullable=False),        # money | gpu_hours
        sa.Column("threshold", sa.Integer(), nullable=False),              # percent of the budget
        sa.Column("used", _NUM, nullable=False),
        sa.Column("budget", _NUM, nullable=False),
        sa.Column("contact", sa.String(length=1024), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),         # sending | sent | failed
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("sent_at", _TS, nullable=True),
        sa.ForeignKeyConstraint(["quota_id"], ["quotas.id"], name=op.f("fk_quota_alerts_quota_id_quotas"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_alerts")),
        sa.UniqueConstraint("quota_id", "period_start", "measure", "threshold",
                            name=op.f("uq_quota_alerts_quota_id_period_start_measure_threshold")),
    )
    op.add_column("quotas", sa.Column("alert_at", sa.String(length=64), nullable=True))
    if pg:
        # the admin role's default privileges (0004) cover new tables and sequences; no reader grant
        op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON alert_contacts, quota_alerts TO gpuhpc_admin")
        op.execute("GRANT USAGE, SELECT ON SEQUENCE quota_alerts_id_seq TO gpuhpc_admin")
        for table in ADMIN_TABLES:
            op.execute(f"REVOKE ALL ON {table} FROM gpuhpc_reader")


def downgrade() -> None:
    bind = op.get_bind()
    calendar = ", ".join(f"'{p}'" for p in CALENDAR)
    windows = bind.execute(sa.text(f"SELECT count(*) FROM quotas WHERE period NOT IN ({calendar})")).scalar()
    if windows:
        raise RuntimeError(f"{windows} quota(s) have an allocation window, which the ledger before 0010 cannot "
                           f"read: set them to a calendar period (gpuhpc quota set --period month) first")
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.drop_column("alert_at")
    op.drop_table("quota_alerts")
    op.drop_table("alert_contacts")
