"""monitoring: per-run GPU utilisation summaries next to the charges; per-node deep-check baselines

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

``run_utilisation``: one row per settled run (``usage_records``), written by ``gpuhpc ledger
ingest`` from one Prometheus query per run, so that ``gpuhpc report efficiency`` keeps working
after Prometheus' retention. ``node_baselines``: the per-node reference of the deep health
checks (nccl-tests all-reduce bus bandwidth). On PostgreSQL the grants come from 0004's default
privileges.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_utilisation",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("usage_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("slurm_job_id", sa.String(length=32), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("step_s", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("mean_util", sa.Float(), nullable=True),
        sa.Column("peak_util", sa.Float(), nullable=True),
        sa.Column("peak_memory_bytes", sa.Float(), nullable=True),
        sa.Column("idle_gpu_hours", sa.Numeric(precision=20, scale=6), nullable=False),
        sa.Column("held_gpu_hours", sa.Numeric(precision=20, scale=6), nullable=False),
        sa.Column("cpu_used_seconds", sa.Float(), nullable=True),
        sa.Column("peak_rss_bytes", sa.Float(), nullable=True),
        sa.Column("devices", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["usage_id"], ["usage_records.id"],
                                name=op.f("fk_run_utilisation_usage_id_usage_records"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_utilisation")),
        sa.UniqueConstraint("usage_id", name=op.f("uq_run_utilisation_usage_id")),
    )
    op.create_table(
        "node_baselines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_baselines")),
        sa.UniqueConstraint("node", "name", name=op.f("uq_node_baselines_node_name")),
    )


def downgrade() -> None:
    op.drop_table("node_baselines")
    op.drop_table("run_utilisation")
