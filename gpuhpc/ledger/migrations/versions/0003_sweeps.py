"""sweeps: sweeps, their array chunks and trials (gpuhpc.sweeps)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("directory", sa.Text(), nullable=False),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("driver_job_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_table(
        "sweep_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("n_tasks", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], name=op.f("fk_sweep_chunks_sweep_id_sweeps"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep_chunks")),
        sa.UniqueConstraint("sweep_id", "number", name=op.f("uq_sweep_chunks_sweep_id_number")),
    )
    op.create_index(op.f("ix_sweep_chunks_sweep_id"), "sweep_chunks", ["sweep_id"], unique=False)
    op.create_table(
        "sweep_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("raw_state", sa.String(length=64), nullable=True),
        sa.Column("chunk_id", sa.Integer(), nullable=True),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.String(length=48), nullable=True),
        sa.Column("job_id_raw", sa.String(length=32), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("gpu_hours", sa.Numeric(precision=20, scale=6), nullable=False),
        sa.Column("exit_code", sa.String(length=16), nullable=True),
        sa.Column("metrics", sa.Text(), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["chunk_id"], ["sweep_chunks.id"], name=op.f("fk_sweep_trials_chunk_id_sweep_chunks")),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], name=op.f("fk_sweep_trials_sweep_id_sweeps"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep_trials")),
        sa.UniqueConstraint("sweep_id", "number", name=op.f("uq_sweep_trials_sweep_id_number")),
    )
    op.create_index(op.f("ix_sweep_trials_sweep_id"), "sweep_trials", ["sweep_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sweep_trials_sweep_id"), table_name="sweep_trials")
    op.drop_table("sweep_trials")
    op.drop_index(op.f("ix_sweep_chunks_sweep_id"), table_name="sweep_chunks")
    op.drop_table("sweep_chunks")
    op.drop_table("sweeps")
