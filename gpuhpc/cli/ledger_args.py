"""What the ledger's command groups share (``db``, ``ledger``, ``quota``, ``report``): the
``--json`` flag, time and money arguments, and the admin check.

Heavy modules (sqlalchemy, the ledger) are imported inside the functions."""
from __future__ import annotations

import datetime as dt

import click

JSON = click.option("--json", "json_", is_flag=True)


def time_arg(text: str | None, what: str) -> dt.datetime | None:
    """ISO date/time (UTC unless an offset is given), or relative like ``7d`` / ``12h``."""
    if not text:
        return None
    from gpuhpc.errors import UserInputError

    t = text.strip()
    now = dt.datetime.now(dt.timezone.utc)
    if t[:-1].isdigit() and t[-1:] in ("d", "h", "m"):
        n = int(t[:-1])
        return now - {"d": dt.timedelta(days=n), "h": dt.timedelta(hours=n), "m": dt.timedelta(minutes=n)}[t[-1]]
    try:
        v = dt.datetime.fromisoformat(t)
    except ValueError:
        raise UserInputError(f"{what}: cannot parse {text!r}", hint="use 2026-11-01, 2026-11-01T12:00 or 7d") from None
    return v.replace(tzinfo=dt.timezone.utc) if v.tzinfo is None else v.astimezone(dt.timezone.utc)


def money_arg(value: str | None, what: str):
    if value is None:
        return None
    from gpuhpc.ledger.pricing import parse_money

    return parse_money(value, what=what)


def cluster_names(cluster: str | None, clusters: str | None) -> list[str]:
    """``--cluster NAME`` / ``--clusters A,B`` as Slurm's lower-case cluster names ([]: neither given)."""
    import re

    from gpuhpc.errors import UserInputError

    if cluster and clusters:
        raise UserInputError("give --cluster or --clusters, not both", field="--clusters")
    what = "--cluster" if cluster else "--clusters"
    names = [n.strip().lower() for n in (cluster or clusters or "").split(",") if n.strip()]
    if (cluster or clusters) and not names:
        raise UserInputError(f"{what}: no cluster name given", field=what, hint="e.g. --clusters gpuhpc,other")
    for n in names:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", n):
            raise UserInputError(f"{what}: {n!r} is not a Slurm cluster name", field=what,
                                 hint="letters, digits, '-' and '_' (ClusterName in slurm.conf)")
    return list(dict.fromkeys(names))


def admin_only(what: str) -> None:
    """Admin commands: one-line permission error (nothing changed) for a user who may not write the ledger."""
    from gpuhpc.ledger import admin

    admin.require_admin(what)


def redacted_url() -> str:
    from sqlalchemy.engine import make_url

    from gpuhpc.ledger.paths import db_url

    return make_url(db_url()).render_as_string(hide_password=True)
