"""Issue 34 point 9 at submit, on the local cluster: the installed job_submit.lua counts a MIG slice
by its fraction of a GPU, with the weights the ledger writes into the budget snapshot (one source,
gpuhpc.ledger.pricing.gpu_weight; the cluster's types from sync-slurm's publish, so a slice without
a price is weighed too). A GPU-hour budget of 0.5 for an account of the test's own admits three
1-hour ``1g.10gb`` slices and not four, one ``3g.40gb`` and not two, an array of three slices and
not four; a slice counted as a whole GPU (as before) would have been refused at one. Jobs are
submitted held and cancelled; the account, its association and the snapshot as it was are put
back. (Unit tests of the snapshot: tests/unit/ledger/test_mig_snapshot.py.)"""
from __future__ import annotations

import getpass
from decimal import Decimal

import pytest

from gpuhpc.ledger import admin, budget, db, slurm_sync
from gpuhpc.slurm import commands as cmd
from polling import wait_for

pytestmark = pytest.mark.integration

ACCOUNT = "mig-budget"
LEFT = "account mig-budget: budget 0.50 GPU-hours for "


@pytest.fixture()
def mig_budget(sqlite_url, client, jobs, tmp_path):
    """The account in the ledger (0.5 GPU-hours a month, no MIG price) and in Slurm, published."""
    url = sqlite_url
    db.upgrade(url)
    admin.add_account(ACCOUNT, description="issue 34.9 MIG at submit", url=url)
    admin.add_user(getpass.getuser(), ACCOUNT, url=url)
    admin.set_quota(ACCOUNT, gpu_hours=Decimal("0.5"), url=url)
    path = budget.snapshot_path()
    before = path.read_bytes() if path.exists() else None
    try:
        slurm_sync.sync(client, slurm_sync.plan(url=url, accounts=[ACCOUNT]))
        slurm_sync.publish(url=url, billing_file=tmp_path / "billing.json")
        yield path
    finally:
        for j in jobs:
            client.run(cmd.scancel(j), check=False)
        wait_for(lambda: all(r.state.state.is_finished for r in client.queue(job_ids=jobs)) if jobs else True, 60,
                 "the held test jobs to end")
        jobs.clear()
        if before is None:
            path.unlink(missing_ok=True)
        else:
            budget.write_atomic(path, before.decode())
        client.sacctmgr_delete("user", [("name", getpass.getuser()), ("account", ACCOUNT)], check=False)
        client.sacctmgr_delete("account", [("name", ACCOUNT)], check=False)


def test_job_submit_lua_admits_n_mig_slices_and_not_one_more(mig_budget, client, jobs):
    text = mig_budget.read_text()
    assert "weight\t1g.10gb\t1/7\n" in text and "weight\t3g.40gb\t3/7\n" in text, text   # the cluster's types

    def sbatch(*args: str):
        r = client.run(cmd.sbatch(extra=["-H", "-A", ACCOUNT, "-p", "mig", "-t", "60", "-o", "/dev/null", *args,
                                         "--wrap", "true"]), check=False)
        if r.ok:
            jobs.append(r.stdout.strip().split(";")[0])
        return r

    for admitted, refused, uses in ((["--gres=gpu:1g.10gb:3"], ["--gres=gpu:1g.10gb:4"], "0.57"),
                                    (["--gres=gpu:3g.40gb:1"], ["--gres=gpu:3g.40gb:2"], "0.86"),
                                    (["--gres=gpu:1g.10gb:1", "--array=0-2"],
                                     ["--gres=gpu:1g.10gb:1", "--array=0-3"], "0.57")):
        r = sbatch(*admitted)
        assert r.ok, (admitted, r.stderr)
        r = sbatch(*refused)
        assert not r.ok and LEFT in r.stderr and f"0.50 GPU-hours left; this job may use {uses} GPU-hours" \
            in r.stderr, (refused, r.stdout, r.stderr)
