"""CLI for the ledger database: ``gpuhpc db upgrade`` and ``gpuhpc db current``.

Heavy modules (sqlalchemy, alembic, rich) are imported inside the commands.
"""
from __future__ import annotations

import sys

import click

from gpuhpc.cli.ledger_args import JSON, redacted_url
from gpuhpc.cli.main import help_for


@click.group("db", help=help_for("db"), no_args_is_help=True)
def db() -> None:
    pass


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def db_upgrade(revision: str) -> None:
    """Create or migrate the ledger database (GPUHPC_DB_URL, else the embedded SQLite file)."""
    from gpuhpc.ledger import db

    before, after = db.upgrade(None, revision)
    if before == after:
        sys.stderr.write(f"ledger database {redacted_url()}: already at {after}\n")
    else:
        sys.stderr.write(f"ledger database {redacted_url()}: {before or 'empty'} -> {after}\n")


@db.command("current")
@JSON
def db_current(json_: bool) -> None:
    """Show the schema revision of the ledger database and the one this gpuhpc needs."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import db

    cur = db.current_revision(db.get_engine())
    data = {"url": redacted_url(), "current": cur, "head": db.SCHEMA_HEAD, "up_to_date": cur == db.SCHEMA_HEAD}
    if json_:
        print_json(data)
    else:
        sys.stdout.write(f"{data['url']}: {cur or 'no schema'} (head {db.SCHEMA_HEAD})"
                         f"{'' if data['up_to_date'] else ' — run `gpuhpc db upgrade`'}\n")
