"""The ledger's audit trail (``ledger_audit``, migration 0009): who changed a price, a multiplier,
a quota, a policy, or booked an adjustment, when, and the value before and after (JSON).

A row is written in the same transaction as the change it describes (it commits or rolls back
with it). The table is append-only (a trigger refuses UPDATE and DELETE) and admins only.
"""
from __future__ import annotations

import datetime as dt
import getpass
import json
from decimal import Decimal

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from gpuhpc.ledger.orm import LedgerAudit, utcnow


def _plain(v: object) -> object:
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, dt.datetime):
        return v.isoformat()
    return str(v)


def dumps(value: dict | None) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=_plain)


def actor(s: Session) -> str:
    """Who is changing the ledger: the Unix user, and on PostgreSQL the database role when it
    has another name (``alice as ledger_admin``)."""
    me = getpass.getuser()
    if s.get_bind().dialect.name == "postgresql":
        role = s.execute(text("SELECT current_user")).scalar()
        if role and role != me:
            return f"{me} as {role}"[:128]
    return me[:128]


def record(s: Session, action: str, target: str, before: dict | None, after: dict | None,
           *, at: dt.datetime | None = None) -> None:
    """Add one audit row to the session's transaction (nothing when nothing changed)."""
    if before == after:
        return
    s.add(LedgerAudit(at=at or utcnow(), actor=actor(s), action=action[:32], target=target[:255],
                      before=dumps(before), after=dumps(after)))


def entries(s: Session, *, since: dt.datetime | None = None, action: str | None = None) -> list[dict]:
    stmt = select(LedgerAudit).order_by(LedgerAudit.id)
    if since is not None:
        stmt = stmt.where(LedgerAudit.at >= since)
    if action:
        stmt = stmt.where(LedgerAudit.action.startswith(action))
    return [{"id": a.id, "at": a.at.isoformat(), "actor": a.actor, "action": a.action, "target": a.target,
             "before": json.loads(a.before) if a.before else None, "after": json.loads(a.after) if a.after else None}
            for a in s.scalars(stmt)]
