"""gpuhpc ledger check on the local cluster (issue 34): the ledger and the running Slurm in step
after sync-slurm (exit 0); a limit changed with sacctmgr behind the ledger's back, and a price
that takes effect without the collection's reconfigure, each exit 1 naming what drifted.

The ledger is a PostgreSQL database of the test's own. Its price book is the one the live
slurm.conf was rendered from (the billing document the collection read, /etc/gpuhpc/billing.json,
read here, never written; none: the cluster bills CPUs and the price book starts empty), so the
expectation is the live state. Own account only (ledgerchk-t1), removed in a finally block.
"""
from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import pytest

from gpuhpc.cli.main import main
from gpuhpc.ledger import admin, budget, db, slurm_sync
from gpuhpc.slurm.client import SlurmClient

pytestmark = pytest.mark.integration

ACCT = "ledgerchk-t1"


def live_price_book(url: str) -> dict:
    """Load the billing document the live slurm.conf carries into the ledger at ``url`` (rates in
    billing units: per GPU-hour in millionths; a fraction of a whole rate as ``of``/``fraction``)."""
    path = budget.billing_path()
    doc = json.loads(path.read_text()) if path.exists() else {}
    rates = {t: Fraction(r) for t, r in (doc.get("rates") or {}).items()}
    whole = {t: r for t, r in rates.items() if r.denominator == 1}
    for t, r in sorted(rates.items(), key=lambda kv: kv[1].denominator):
        if r.denominator == 1:
            admin.set_price(t, rate=Decimal(r.numerator) / budget.MICRO, url=url)
        else:
            base = next(iter(whole))
            admin.set_price(t, base=base, fraction=str(r / whole[base]), url=url)
    for part, m in (doc.get("partitions") or {}).items():
        m = Fraction(m)
        dec = Decimal(m.numerator) / Decimal(m.denominator)
        assert Fraction(dec) == m, f"{path}: multiplier {m} of {part} is not a decimal"
        admin.set_multiplier("partition", part, dec, url=url)
    return doc


def ledger_check(capsys, *args: str) -> tuple[int, list[str], str]:
    rc = main(["ledger", "check", "--account", ACCT, *args])
    cap = capsys.readouterr()
    return rc, cap.out.splitlines(), cap.err


def test_check_in_step_then_a_hand_changed_limit_and_an_unapplied_price(pg_url, monkeypatch, capsys):
    monkeypatch.setenv("GPUHPC_DB_URL", pg_url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    db.upgrade(pg_url)
    doc = live_price_book(pg_url)
    admin.add_account(ACCT, description="issue 34 test", url=pg_url)
    admin.set_quota(ACCT, gpu_hours=Decimal(1), period="day", url=pg_url)            # 58 GPU-minutes in Slurm
    client = SlurmClient()
    cluster = client.cluster_name()
    try:
        plans = slurm_sync.plan(url=pg_url, accounts=[ACCT])
        slurm_sync.sync(client, plans)
        slurm_sync.record_periods(plans, url=pg_url)

        # --- in step: the live weights are the price book's, the limit is sync-slurm's
        rc, out, err = ledger_check(capsys)
        assert (rc, out) == (0, []), err
        assert "the ledger and Slurm are in step" in err

        # --- an admin raises the budget in Slurm by hand: the ledger's quota says 58
        client.sacctmgr_modify("account", [("name", ACCT), ("cluster", cluster)], [("GrpTRESMins", "gres/gpu=999")])
        rc, out, err = ledger_check(capsys)
        assert rc == 1 and out == [f"account {ACCT}: GrpTRESMins gres/gpu=999 in Slurm, the ledger's quota gives "
                                   f"billing=none,gres/gpu=58; fix: gpuhpc ledger sync-slurm --account {ACCT}"], (out, err)
        slurm_sync.sync(client, slurm_sync.plan(url=pg_url, accounts=[ACCT]))       # the fix it names
        assert ledger_check(capsys)[:2] == (0, [])

        # --- a new h100 price effective now, never applied to slurm.conf (no collection run)
        running = client.partition_billing_weights()
        admin.set_price("h100", rate=Decimal("9.99"), url=pg_url)
        mult = Fraction((doc.get("partitions") or {}).get("gpu", "1"))
        want = Fraction("9.99") * mult * budget.MICRO
        assert want.denominator == 1
        rc, out, err = ledger_check(capsys, "--json")
        assert rc == 1, err
        diffs = {d["what"]: d for d in json.loads("\n".join(out))["differences"]}
        gpu = diffs["partition gpu"]
        assert gpu["kind"] == "weights" and gpu["slurm"] == running["gpu"], gpu
        assert gpu["ledger"] == f"CPU=0,GRES/gpu={want.numerator}", gpu
        assert gpu["line"].startswith(f"partition gpu: TRESBillingWeights {running['gpu']} in slurmctld, the price "
                                      f"book gives CPU=0,GRES/gpu={want.numerator}; fix: gpuhpc ledger billing")
        assert {d["kind"] for d in diffs.values()} == {"weights"}         # the limit is still in step
    finally:
        client.sacctmgr_delete("account", [("name", ACCT)], check=False)
