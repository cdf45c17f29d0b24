"""``gpuhpc ledger price``: the price book (set, load, list) (added to the ``ledger`` group by
:mod:`gpuhpc.cli.ledger`). Heavy modules are imported inside the commands."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from gpuhpc.cli.ledger_args import JSON, admin_only, money_arg, time_arg


@click.group("price", no_args_is_help=True)
def price() -> None:
    """The price book: GPU-type / MIG rates, partition and QOS multipliers."""


@price.command("set")
@click.option("--gpu-type", help="GPU type or MIG profile (h100, 3g.40gb, '*' = default).")
@click.option("--rate", help="Price per GPU-hour.")
@click.option("--of", help="Price this type as a fraction of another GPU type.")
@click.option("--fraction", help="With --of: exact fraction such as 3/7.")
@click.option("--partition", help="Partition whose multiplier to set.")
@click.option("--qos", help="QOS whose multiplier to set.")
@click.option("--multiplier", help="Multiplier for --partition/--qos (0.6 = 40% cheaper).")
@click.option("--effective", help="Effective from (default now).")
@click.option("--currency", default="USD", show_default=True)
def price_set(gpu_type: Optional[str], rate: Optional[str], of: Optional[str], fraction: Optional[str],
              partition: Optional[str], qos: Optional[str], multiplier: Optional[str], effective: Optional[str],
              currency: str) -> None:
    """Set a GPU rate and/or a partition/QOS multiplier (effective-dated)."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import admin

    admin_only("ledger price set")
    eff = time_arg(effective, "--effective")
    did = False
    if gpu_type:
        if of and not fraction:
            raise UserInputError("--of needs --fraction (e.g. 3/7)")
        admin.set_price(gpu_type, rate=money_arg(rate, "--rate"), base=of, fraction=fraction, effective_from=eff,
                        currency=currency)
        did = True
    if partition or qos:
        if multiplier is None:
            raise UserInputError("--partition/--qos need --multiplier")
        m = money_arg(multiplier, "--multiplier")
        if partition:
            admin.set_multiplier("partition", partition, m, effective_from=eff)
        if qos:
            admin.set_multiplier("qos", qos, m, effective_from=eff)
        did = True
    if not did:
        raise UserInputError("nothing to set", hint="--gpu-type T --rate R, or --partition P --multiplier M")


@price.command("load")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def price_load(file: Path) -> None:
    """Load a price book YAML FILE (see docs/ledger.md)."""
    from gpuhpc.ledger import pricebook

    admin_only("ledger price load")
    n = pricebook.load_file(file)
    sys.stderr.write(f"loaded {n} price entries from {file}\n")


@price.command("list")
@JSON
def price_list(json_: bool) -> None:
    """Show the price book."""
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.ledger import admin, pricing

    rows = admin.list_prices()
    for r in rows:          # what an hour of one counts in GPU-hour quotas (a MIG slice: its fraction)
        if r["kind"] == "gpu":
            r["gpu_hours_per_hour"] = str(pricing.gpu_weight(r["name"]))
    if json_:
        print_json(rows)
        return
    from rich.table import Table

    t = Table("kind", "name", "rate / multiplier", "effective from")
    for r in rows:
        val = (f"{r['rate']} {r['currency']}/GPU-h" if r.get("rate") is not None else
               f"{r['fraction']} of {r['of']}" if r.get("of") else f"× {r['multiplier']}")
        if r.get("gpu_hours_per_hour", "1") != "1":
            val += f" ({r['gpu_hours_per_hour']} GPU-h an hour)"
        t.add_row(r["kind"], r["name"], val, r["effective_from"])
    console().print(t)
