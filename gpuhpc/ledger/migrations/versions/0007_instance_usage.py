"""elastic: instance_usage, one row per cloud instance (launch, registration, last job, suspend,
end; prices per hour at launch)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Filled by ``gpuhpc power ingest`` from the elastic journal; read by ``gpuhpc report cost`` and
``gpuhpc report instances``. The cluster's own cost, not a user's: no grant to gpuhpc_reader
(ADMIN_TABLES; tests/unit/ledger/test_ledger_rls_tables.py accepts these).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ADMIN_TABLES = ("instance_usage",)


def upgrade() -> None:
    op.create_table(
        "instance_usage",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("instance_id", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("market", sa.String(length=16), nullable=False),
        sa.Column("launched_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_busy_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("suspend_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=16), nullable=False),
        sa.Column("orphan", sa.Boolean(), nullable=False),
        sa.Column("price_per_hour", sa.Numeric(precision=20, scale=6), nullable=False),
        sa.Column("on_demand_price_per_hour", sa.Numeric(precision=20, scale=6), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_usage")),
        sa.UniqueConstraint("cluster", "instance_id", name=op.f("uq_instance_usage_cluster_instance_id")),
    )


def downgrade() -> None:
    op.drop_table("instance_usage")
