"""``gpuhpc ledger account``: ledger accounts (add, list) (added to the ``ledger`` group by
:mod:`gpuhpc.cli.ledger`). Heavy modules are imported inside the commands."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli.ledger_args import JSON, admin_only


@click.group("account", no_args_is_help=True)
def account() -> None:
    """Ledger accounts (projects)."""


@account.command("add")
@click.argument("name")
@click.option("--description", default="", help="Free text.")
def account_add(name: str, description: str) -> None:
    """Create a ledger account (project)."""
    from gpuhpc.ledger import admin

    admin_only("ledger account add")
    created = admin.add_account(name, description=description)
    sys.stderr.write(f"account {name} {'created' if created else 'exists'}\n")


@account.command("list")
@JSON
def account_list(json_: bool) -> None:
    """List accounts and their users (* = the user's default account)."""
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.ledger import admin

    rows = admin.list_accounts()
    if json_:
        print_json(rows)
        return
    from rich.table import Table

    t = Table("account", "description", "users")
    for r in rows:
        t.add_row(r["account"], r["description"], ", ".join(r["users"]))
    console().print(t)
