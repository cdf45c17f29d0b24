"""Every ledger table is either readable by every reader (migration 0006's PUBLIC_TABLES) or
per-user with a row-level-security policy (POLICIES): a new table in neither list fails here,
so it cannot become readable by everyone, nor unreadable, by accident."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gpuhpc.ledger.orm as orm


def _migration(name: str = "0006_reader_rls_every_table.py"):
    path = Path(orm.__file__).parent / "migrations" / "versions" / name
    spec = importlib.util.spec_from_file_location(f"m{name[:4]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_table_is_public_or_row_level_secured():
    m = _migration()
    # a later migration's ADMIN_TABLES: granted to no reader at all (admins only)
    admin = {t for p in sorted((Path(orm.__file__).parent / "migrations" / "versions").glob("0*.py"))
             if p.name > "0006" for t in getattr(_migration(p.name), "ADMIN_TABLES", ())}
    tables = set(orm.Base.metadata.tables) - admin
    # a later migration's POLICIES: per-user tables it adds, each with a reader policy (0009's adjustments)
    later = {t: u for p in sorted((Path(orm.__file__).parent / "migrations" / "versions").glob("0*.py"))
             if p.name[:4] > "0006" for t, u in getattr(_migration(p.name), "POLICIES", {}).items()}
    assert not set(later) & set(m.POLICIES) and not set(later) & admin and all(later.values())
    policies = {**m.POLICIES, **later}
    # the cluster's operational data is no reader's (0007, 0008); names stay public (docs/ledger.md)
    assert {"instance_usage", "ingest_state", "node_baselines"} <= admin and not {"accounts", "users"} & admin
    assert not set(m.PUBLIC_TABLES) & set(policies)
    assert tables <= set(m.PUBLIC_TABLES) | set(policies), sorted(tables - set(m.PUBLIC_TABLES) - set(policies))
    # the tables that hold a user's or an account's data are never public
    for t in ("sweeps", "sweep_trials", "sweep_chunks", "job_metrics", "run_utilisation", "memberships", "quotas",
              "charges", "usage_records", "reservations", "adjustments"):
        assert t in policies
    assert {"ledger_audit", "ledger_policies"} <= admin
