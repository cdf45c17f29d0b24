"""Issue 40.11: one data path for the sweep tables. Every module of :mod:`gpuhpc.sweeps` reads
and writes ``sweeps``, ``sweep_chunks`` and ``sweep_trials`` through the DB-API transaction of
:func:`gpuhpc.sweeps.store.connect` and the named queries of :mod:`gpuhpc.sweeps.queries`:
none imports SQLAlchemy or the ledger's ORM (at module level or inside a function), and there
is no ``gpuhpc.sweeps.models`` to import (the tables are declared in ``gpuhpc/ledger/orm.py``
for Alembic only)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import gpuhpc.sweeps

SWEEPS = Path(gpuhpc.sweeps.__file__).parent
GPUHPC = SWEEPS.parent
#: SQL that names a sweep table
SWEEP_SQL = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)\s+(sweeps|sweep_chunks|sweep_trials)\b", re.IGNORECASE)
#: modules that are the ORM or reach it (a session, the mapped classes)
ORM_MODULES = ("sqlalchemy", "gpuhpc.ledger.orm", "gpuhpc.sweeps.models")
ORM_NAMES = {("gpuhpc.ledger", "orm"), ("gpuhpc.ledger.db", "session_scope"), ("gpuhpc.ledger.db", "get_engine"),
             ("gpuhpc.sweeps", "models")}


def _orm_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                      if any(a.name == m or a.name.startswith(m + ".") for m in ORM_MODULES)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(node.module == m or node.module.startswith(m + ".") for m in ORM_MODULES):
                found.append(f"{path.name}:{node.lineno}: from {node.module} import ...")
            found += [f"{path.name}:{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if (node.module, a.name) in ORM_NAMES]
        elif isinstance(node, ast.Attribute) and node.attr in ("session_scope", "session", "get_engine") \
                and isinstance(node.value, ast.Name) and node.value.id in ("db", "store"):
            found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_sweeps_module_uses_sqlalchemy_or_the_orm():
    modules = sorted(SWEEPS.glob("*.py"))
    assert len(modules) > 10, modules              # the scan sees the package
    found = [hit for m in modules for hit in _orm_uses(m)]
    assert found == [], "the sweep tables are read and written through gpuhpc.sweeps.queries only:\n" + "\n".join(found)


def test_there_is_no_sweeps_models_module():
    assert not (SWEEPS / "models.py").exists()


def test_the_scan_sees_an_orm_use(tmp_path):
    """The check itself: each form of an ORM use is found (deferred imports too)."""
    f = tmp_path / "m.py"
    f.write_text("def f(url):\n"
                 "    from sqlalchemy import update\n"
                 "    import sqlalchemy.orm\n"
                 "    from gpuhpc.sweeps.models import Sweep\n"
                 "    from gpuhpc.ledger import orm\n"
                 "    from gpuhpc.ledger.db import session_scope\n"
                 "    with store.session(url) as s:\n"
                 "        pass\n")
    assert [h.split(": ", 1)[0] for h in _orm_uses(f)] == [f"m.py:{n}" for n in (2, 3, 4, 5, 6, 7)]


def _sweep_sql(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.relative_to(GPUHPC.parent)}:{node.lineno}: {node.value.strip()[:60]!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SWEEP_SQL.search(node.value)]


def test_only_the_named_queries_hold_sql_of_the_sweep_tables():
    """Every statement on sweeps, sweep_chunks and sweep_trials is a function of
    gpuhpc/sweeps/queries.py (the migrations, which create them, aside)."""
    assert _sweep_sql(SWEEPS / "queries.py")                  # the scan sees them where they are
    found = [hit for m in sorted(GPUHPC.rglob("*.py"))
             if m != SWEEPS / "queries.py" and "migrations" not in m.parts for hit in _sweep_sql(m)]
    assert found == [], "SQL of the sweep tables outside gpuhpc/sweeps/queries.py:\n" + "\n".join(found)
