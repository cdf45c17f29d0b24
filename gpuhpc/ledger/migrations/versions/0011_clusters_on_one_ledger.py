"""several clusters on one ledger: quotas per cluster, one ingest watermark per cluster

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

* ``quotas.cluster``: the one cluster (ClusterName, lower case) whose usage a quota counts; NULL, as
  every quota before this revision: usage on every cluster of the ledger counts (``gpuhpc quota set
  --cluster``). ``quotas.cluster_key`` is the cluster or ``''`` (as ``user_key`` is the user or 0),
  so that the unique key ``(account_id, user_key, cluster_key)`` allows one quota per account (and
  user) per cluster besides the one for all clusters. On SQLite the new unique key recreates the
  table (batch; foreign keys are off during migrations, env.py); on PostgreSQL the columns and the
  key are altered in place, so the row-level-security policy of ``quotas`` (0006, by account) and
  the reader's table grant (SELECT on the whole table: new columns included) stay as they are.
* ``ingest_state.name`` grows to 128 characters: besides the ``sacct`` row (the lock every ingest
  takes, and its last run), each cluster has its own watermark row ``sacct:CLUSTER``. The table
  stays admins only (0008). Nothing is copied: the first ingest of a cluster after the upgrade
  starts from the old ``sacct`` row's last run (:func:`gpuhpc.ledger.ingest.default_since`).

Downgrade refuses while a quota names a cluster (a ledger before 0011 would count it on every
cluster); it drops the per-cluster watermark rows.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cluster", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("cluster_key", sa.String(length=64), server_default="", nullable=False))
        batch_op.drop_constraint("uq_quotas_account_id_user_key", type_="unique")
        batch_op.create_unique_constraint(op.f("uq_quotas_account_id_user_key_cluster_key"),
                                          ["account_id", "user_key", "cluster_key"])
    with op.batch_alter_table("ingest_state", schema=None) as batch_op:     # SQLite: the small table is copied
        batch_op.alter_column("name", type_=sa.String(length=128), existing_type=sa.String(length=32),
                              existing_nullable=False)


def downgrade() -> None:
    bind = op.get_bind()
    scoped = bind.execute(sa.text("SELECT count(*) FROM quotas WHERE cluster IS NOT NULL")).scalar()
    if scoped:
        raise RuntimeError(f"{scoped} quota(s) count one cluster's usage only, which the ledger before 0011 cannot "
                           f"read: remove them (gpuhpc quota remove --cluster NAME) first")
    op.execute("DELETE FROM ingest_state WHERE name LIKE 'sacct:%'")
    with op.batch_alter_table("ingest_state", schema=None) as batch_op:
        batch_op.alter_column("name", type_=sa.String(length=32), existing_type=sa.String(length=128),
                              existing_nullable=False)
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.drop_constraint("uq_quotas_account_id_user_key_cluster_key", type_="unique")
        batch_op.create_unique_constraint(op.f("uq_quotas_account_id_user_key"), ["account_id", "user_key"])
        batch_op.drop_column("cluster_key")
        batch_op.drop_column("cluster")
