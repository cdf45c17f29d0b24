"""``gpuhpc ledger account``: ledger accounts (add, set: codes and the alert contact, list) (added to the ``ledger`` group by
:mod:`gpuhpc.cli.ledger`). Heavy modules are imported inside the commands."""
from __future__ import annotations

import sys
from typing import Optional

import click

from gpuhpc.cli.ledger_args import JSON, admin_only


@click.group("account", no_args_is_help=True)
def account() -> None:
    """Ledger accounts (projects)."""


@account.command("add")
@click.argument("name")
@click.option("--description", default="", help="Free text.")
@click.option("--grant", help="The grant its cost is booked to (a code, up to 64 characters).")
@click.option("--cost-centre", help="Its cost centre (a code, up to 64 characters).")
def account_add(name: str, description: str, grant: Optional[str], cost_centre: Optional[str]) -> None:
    """Create a ledger account (project)."""
    from gpuhpc.ledger import admin

    admin_only("ledger account add")
    created = admin.add_account(name, description=description, grant=grant, cost_centre=cost_centre)
    sys.stderr.write(f"account {name} {'created' if created else 'exists'}\n")


@account.command("set")
@click.argument("name")
@click.option("--grant", help="The grant its cost is booked to ('' clears it).")
@click.option("--cost-centre", help="Its cost centre ('' clears it).")
@click.option("--contact", help="Where its budget alerts go (the PI): mailto:pi@example.org or an https:// "
                                "webhook ('' clears it).")
def account_set(name: str, grant: Optional[str], cost_centre: Optional[str], contact: Optional[str]) -> None:
    """Set an account's grant and cost-centre codes and its alert contact (audited)."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import admin, alerts

    if grant is None and cost_centre is None and contact is None:
        raise UserInputError("nothing to set", field="--grant",
                             hint="--grant CODE, --cost-centre CODE and/or --contact mailto:ADDRESS|https://URL")
    if contact is not None:
        alerts.contact_arg(contact)          # bad input: exit 2 before anything changes
    admin_only("ledger account set")
    changed = False
    if grant is not None or cost_centre is not None:
        changed = admin.set_account(name, grant=grant, cost_centre=cost_centre)
    if contact is not None:
        changed = alerts.set_contact(name, contact) or changed
    sys.stderr.write(f"account {name} {'updated' if changed else 'unchanged'}\n")


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

    t = Table("account", "description", "grant", "cost centre", "users")
    for r in rows:
        t.add_row(r["account"], r["description"], r["grant"] or "", r["cost_centre"] or "", ", ".join(r["users"]))
    console().print(t)
