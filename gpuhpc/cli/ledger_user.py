"""``gpuhpc ledger user``: ledger users and their memberships (add) (added to the ``ledger`` group by
:mod:`gpuhpc.cli.ledger`). Heavy modules are imported inside the commands."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli.ledger_args import admin_only


@click.group("user", no_args_is_help=True)
def user() -> None:
    """Ledger users and their account memberships."""


@user.command("add")
@click.argument("name")
@click.option("--account", required=True, help="Account to join.")
@click.option("--default", is_flag=True, help="Make it the user's default account.")
def user_add(name: str, account: str, default: bool) -> None:
    """Add a user to an account."""
    from gpuhpc.ledger import admin

    admin_only("ledger user add")
    created = admin.add_user(name, account, default=default)
    sys.stderr.write(f"user {name} {'added to' if created else 'already in'} {account}\n")
