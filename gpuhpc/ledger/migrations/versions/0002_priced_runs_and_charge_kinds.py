"""priced flag on usage records, kind of charge (usage or reprice)

A run settled while the price book had no rate for its GPU type is stored with
``priced = false`` (charged 0) so that ``gpuhpc ledger ingest --reprice`` can charge it once a
price exists; the correction is its own charge row of kind ``reprice`` (the history stays).
Existing GPU runs charged 0 are marked unpriced.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMN (SQLite can): no batch copy of tables with millions of rows
    op.add_column("usage_records", sa.Column("priced", sa.Boolean(), server_default=sa.true(), nullable=False))
    op.add_column("charges", sa.Column("kind", sa.String(length=16), server_default="usage", nullable=False))
    op.execute(sa.text("UPDATE usage_records SET priced = :f WHERE gpus > 0 AND amount = 0 AND elapsed_s > 0")
               .bindparams(f=False))


def downgrade() -> None:
    with op.batch_alter_table("charges", schema=None) as batch_op:
        batch_op.drop_column("kind")
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_column("priced")
