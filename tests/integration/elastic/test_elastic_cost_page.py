"""The HTML cost page shows elastic capacity's instance-hours (issue 24): ``gpuhpc power ingest``
folds an instance journal into a SQLite ledger that also holds the jobs' runs, ``gpuhpc report
cost --html`` writes the page, and headless Chromium loads it (as the efficiency and sprint pages
are checked): the instance table splits instance-hours into boot, busy, idle, suspend and orphan
that add up, with cost and spot savings, and the jobs' GPU-hours of the same range beside them
equal the cost table's. No cluster (isolated)."""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from gpuhpc.elastic import journal
from gpuhpc.elastic.config import load_config
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.ledger import admin, db, ingest
from gpuhpc.slurm.commands import SACCT_RUN_FIELDS, SEP
from gpuhpc.slurm.parsers import parse_sacct

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

REPO = Path(__file__).resolve().parents[3]


def _run(start: float, seconds: int, gpus: int, job_id: str) -> str:
    """One sacct --parsable2 row of a finished run (the ledger's ingest reads these)."""
    ts = lambda t: dt.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731 - local time, as sacct
    tres = f"billing=1,cpu=1,gres/gpu:h100={gpus},gres/gpu={gpus},mem=1000M,node=1"
    d = {"JobID": job_id, "JobIDRaw": job_id, "JobName": "train", "State": "COMPLETED", "Elapsed": "",
         "ElapsedRaw": str(seconds), "Submit": ts(start), "Start": ts(start), "End": ts(start + seconds),
         "AllocTRES": tres, "ReqTRES": tres, "Partition": "spot", "Account": "research", "User": "alice",
         "QOS": "normal", "Cluster": "elcost", "Timelimit": "02:00:00"}
    return SEP.join(d[f] for f in SACCT_RUN_FIELDS)


def _cells(dom: str, table_id: str) -> list[list[str]]:
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', dom, re.S).group(1)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", tr, re.S)]
            for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S) if "<td>" in tr]


def test_the_html_cost_page_shows_instance_hours_that_add_up_with_the_jobs_gpu_hours(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    env = {**os.environ, "GPUHPC_DB_URL": url, "PYTHONPATH": str(REPO), "GPUHPC_DATA_DIR": str(tmp_path / "data")}
    db.upgrade(url)
    t0 = float(int(time.time()) - 3 * 3600)
    admin.add_account("research", url=url)
    admin.add_user("alice", "research", default=True, url=url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=dt.datetime.fromtimestamp(t0 - 86400, dt.timezone.utc),
                    url=url)
    # two spot jobs of 1 GPU on the spot instance's busy hour: 0.5 + 0.25 GPU-hours
    ingest.ingest_rows(parse_sacct("\n".join([_run(t0 + 600, 1800, 1, "11"), _run(t0 + 2400, 900, 1, "12")]),
                                   fields=SACCT_RUN_FIELDS), url=url)
    state = tmp_path / "elastic"
    (tmp_path / "elastic.json").write_text(json.dumps({"cluster_name": "elcost", "power": {"state_dir": str(state), "groups": [
        {"name": "spot", "nodes": "s[1-2]", "provider": "local", "market": "spot", "instance_types": ["g5"],
         "hourly_price": "1.20", "on_demand_hourly_price": "4.00"},
        {"name": "od", "nodes": "o1", "provider": "local", "market": "on_demand", "instance_types": ["g5"],
         "hourly_price": "4.00"}]}}))
    cfg = load_config(tmp_path / "elastic.json")
    spot, od = cfg.pool("spot"), cfg.pool("od")
    journal.append(state,
                   # spot: boot 10 min, busy 1 h, idle 5 min, suspend 5 min
                   journal.launch_event(cfg, spot, Instance("i-1", "s1", "spot", "running", t0, "g5", "spot")),
                   journal.end_event(cfg, "i-1", t0 + 4800, "suspend", registered_at=t0 + 600,
                                     last_busy=t0 + 4200, suspend_at=t0 + 4500),
                   # a reclaimed spot instance: boot 5 min, busy until the end (25 min)
                   journal.launch_event(cfg, spot, Instance("i-2", "s2", "spot", "running", t0, "g5", "spot")),
                   journal.end_event(cfg, "i-2", t0 + 1800, "reclaim", registered_at=t0 + 300),
                   # an orphan (20 min), journalled at its end
                   journal.end_event(cfg, "i-3", t0 + 1200, "orphan", pool=od,
                                     orphan=Instance("i-3", "o1", "od", "running", t0, "g5")))
    gpuhpc = [sys.executable, "-m", "gpuhpc"]
    ing = subprocess.run([*gpuhpc, "power", "ingest", "--config", str(tmp_path / "elastic.json")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert ing.returncode == 0 and "3 instance(s)" in ing.stderr, ing.stderr
    page = tmp_path / "cost.html"
    rep = subprocess.run([*gpuhpc, "report", "cost", "--by", "partition", "--html", str(page)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr

    dom = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not [line for line in dom.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    html = dom.stdout
    assert "<h2>Elastic instances</h2>" in html and html.count("<svg") == 3
    rows = _cells(html, "instances")
    assert [r[:3] for r in rows] == [["g5", "on_demand", "1"], ["g5", "spot", "2"], ["total", "", "3"]], rows
    for r in rows:                             # instance-h = boot + busy + idle + suspend + orphan
        assert abs(float(r[3]) - sum(float(x) for x in r[4:9])) < 0.002, r
    total = rows[-1]
    # 6600 s of spot + 1200 s orphan; boot 900 s, busy 3600 + 1500, idle 300, suspend 300, orphan 1200
    assert [float(x) for x in total[3:9]] == [2.167, 0.25, 1.417, 0.083, 0.083, 0.333], total
    assert float(total[10]) == round(6600 / 3600 * (4.00 - 1.20), 2)                 # spot savings
    # the jobs' GPU-hours beside them: the cost table's, and within the busy spot hours x 1 GPU
    job_gpu_h = sum(float(r[2]) for r in _cells(html, "cost-details") if r)
    summary = " ".join(re.search(r'<p id="instance-summary">(.*?)</p>', html, re.S).group(1).split())
    assert f"Jobs in the same range: {job_gpu_h:,.2f} GPU-hours" in summary and job_gpu_h == 0.75, summary
    assert job_gpu_h <= float(rows[1][5])
    print(f"cost page: {summary}")
