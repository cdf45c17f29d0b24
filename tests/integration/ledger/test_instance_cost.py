"""Elastic instance cost by account on the local cluster (issue 34.10, last part): real jobs of two
accounts on the two GPU nodes (one on each, then one on both), ingested from sacct into a ledger
(SQLite, then PostgreSQL), an elastic journal whose instances are those nodes (and an orphan), and
``gpuhpc ledger report --instances --by-account --json``, which asks sacct where each run ran. Each
account's cost is its runs' seconds on each node x that instance's price; the rest is overhead;
the printed lines add up to instance-hours x price and the reconciliation line says so."""
from __future__ import annotations

import datetime as dt
import json
import shlex
from decimal import Decimal

import pytest

from gpuhpc import hostlist
from gpuhpc.elastic import journal
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.ledger import db, ingest, instances
from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm.client import SlurmClient
from cli_helpers import gpuhpc
from polling import wait_for

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc
NODES = ("gpu-node1", "gpu-node2")
PRICE = {"gpu-node1": Decimal("3.60"), "gpu-node2": Decimal("7.20")}    # 0.001 and 0.002 per second


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Three finished jobs: research on node 1 and on node 2 at once, then root on both (after
    them, so no two of ours share a node). Their sacct rows and their ids; cancelled at the end."""
    client = SlurmClient()
    ids: list[str] = []
    t0 = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(seconds=2)
    script = "#!/bin/bash\nsleep 3\n"
    try:
        def submit(*extra: str) -> str:
            ids.append(client.submit_script(script, extra=["-p", "gpu", "-t", "2", "-J", "gpuhpc-instance-cost",
                                                           "-o", "/dev/null", *extra]))
            return ids[-1]

        a = submit("-A", "research", "-w", NODES[0], "--gres=gpu:h100:2")
        b = submit("-A", "research", "-w", NODES[1], "--gres=gpu:h100:1")
        submit("-A", "root", "-N", "2", "-w", ",".join(NODES), "--gres=gpu:h100:1", f"--dependency=afterany:{a}:{b}")

        def settled():
            rows = [r for r in client.job_runs(t0, job_ids=ids) if r.array_job_id in ids]
            done = [r for r in rows if ingest.parse_time(r.start) and ingest.parse_time(r.end) and r.state.state.is_finished]
            return rows if len(done) == len(ids) else None

        rows = wait_for(settled, 180, lambda: f"the instance-cost jobs to end ({client.queue(job_ids=ids)})", interval=1)
        nodes = {r.job_id: r.nodelist for r in client.accounting(job_ids=ids, duplicates=True)}
        yield rows, nodes, client.cluster_name()
    finally:
        for j in ids:
            client.run(cmd.scancel(j), check=False)


def test_instance_cost_by_account_reconciles_with_instance_hours(any_url, ran, tmp_path):
    url = any_url                                     # SQLite and PostgreSQL
    rows, nodes, cluster = ran
    db.upgrade(url)
    ingest.ingest_rows(rows, url=url)
    start = min(ingest.parse_time(r.start) for r in rows)
    end = max(ingest.parse_time(r.end) for r in rows)
    # the elastic journal: each GPU node an instance that was busy through all our runs, and an orphan
    cfg = ElasticConfig(cluster=cluster, state_dir=str(tmp_path), pools=(
        Pool("gpu", NODES, "local", hourly_price="3.60"), Pool("spot", ("gpu-node9",), "local", hourly_price="1.80")))
    t_launch, t_end = start.timestamp() - 60, end.timestamp() + 20
    for i, n in enumerate(NODES):
        inst = Instance(f"i-{i}", n, "gpu", "running", t_launch, "g5", "on_demand")
        journal.append(tmp_path, journal.launch_event(cfg, cfg.pool("gpu"), inst, price=str(PRICE[n])),
                       journal.end_event(cfg, inst.id, t_end, "suspend", registered_at=t_launch + 30,
                                         last_busy=t_end - 10, suspend_at=t_end - 5))
    journal.append(tmp_path, journal.end_event(cfg, "i-9", t_launch + 600, "orphan", pool=cfg.pool("spot"),
                                               orphan=Instance("i-9", "gpu-node9", "spot", "running", t_launch, "g5")))
    assert instances.ingest(journal.read(tmp_path), url) == 3

    since = dt.datetime.fromtimestamp(t_launch, UTC) - dt.timedelta(minutes=1)
    until = dt.datetime.fromtimestamp(t_launch + 600, UTC) + dt.timedelta(minutes=1)
    res = gpuhpc("ledger", "report", "--instances", "--by-account", "--json", "--since", since.isoformat(),
                 "--until", until.isoformat(), env={"GPUHPC_DB_URL": url})
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    print("\n" + res.stderr.strip())

    # what we expect, from sacct's own start, end and node list of each run
    expected: dict[str, Decimal] = {}
    for r in rows:
        secs = int((ingest.parse_time(r.end) - ingest.parse_time(r.start)).total_seconds())
        per_node = hostlist.expand(nodes[r.job_id])
        assert set(per_node) <= set(NODES), (r.job_id, per_node)
        expected[r.account] = expected.get(r.account, Decimal(0)) + sum(secs * PRICE[n] / 3600 for n in per_node)
    assert {a["account"]: Decimal(a["cost"]) for a in d["accounts"]} == expected
    assert {a["account"]: a["jobs"] for a in d["accounts"]} == {"research": 2, "root": 1}
    life_s = Decimal(repr(t_end - t_launch))
    instance_cost = sum(life_s * p / 3600 for p in PRICE.values()) + 600 * Decimal("1.80") / 3600
    t = d["totals"]
    assert Decimal(t["instance_cost"]) == instance_cost.quantize(Decimal("0.000001"))
    assert Decimal(t["accounts"]) + Decimal(t["overhead"]) == Decimal(t["printed_total"]) == Decimal(t["instance_cost"])
    assert t["reconciled"] is True and d["runs_without_node_list"] == []
    assert {(o["pool"], o["part"]) for o in d["overhead"]} >= {("gpu", "boot"), ("gpu", "idle"), ("gpu", "suspend"),
                                                              ("gpu", "unused"), ("spot", "orphan")}
    assert ": reconciled" in res.stderr
