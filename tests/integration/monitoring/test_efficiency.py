"""`gpuhpc report efficiency` on the real cluster and Prometheus: a 4-GPU job that keeps 2 GPUs
busy (scripted through the NVML stand-in) gets a report naming the 2 idle GPUs and their cost
at the ledger's price; the weekly ranking of its account (one of the test's own) puts it first. The job map is written
by the Prolog hook run with slurmd's environment (as in test_prometheus.py)."""
from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import gpuhpc
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for
from standins import nvml_standin

pytestmark = pytest.mark.integration

STATE_DIR = Path(os.environ.get("GPUHPC_NVML_STATE_DIR", "/var/tmp/gpuhpc-prometheus/nvml"))
JOBMAP_DIR = os.environ.get("GPUHPC_JOBMAP_DIR", "/var/tmp/gpuhpc-prometheus/jobmap")
NAME = "gpuhpc-efficiency"
RATE = "2.50"
# an account of its own: every GPU job of the other tests also shows up in Prometheus (the real
# Prolog keeps the job map), so the ranking is checked among this test's jobs only
ACCOUNT = "gpuhpc-eff-test"
NO_DB = ("GPUHPC_DB_URL",)      # the fixture's env: its own SQLite ledger, whatever GPUHPC_DB_URL says


def _hook(kind: str, node: str, job: str, idx: list[int]) -> None:
    env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_JOB_ID": job, "SLURM_JOB_USER": "root",
           "SLURM_JOB_GPUS": ",".join(map(str, idx)), "GPUHPC_JOBMAP_DIR": JOBMAP_DIR}
    subprocess.run([sys.executable, "-m", "gpuhpc.monitoring.jobmap", kind], env=env, check=True, timeout=30)


@pytest.fixture(scope="module")
def half_idle_job(tmp_path_factory):
    """A finished 4-GPU job whose GPUs 2 and 3 of its four stayed idle for ~35 s (until the figures the
    tests assert are in)."""
    tmp = tmp_path_factory.mktemp("eff")
    env = {**os.environ, "GPUHPC_DATA_DIR": str(tmp / "data")}
    env.pop("GPUHPC_DB_URL", None)
    for args in (("db", "upgrade"), ("ledger", "price", "set", "--gpu-type", "h100", "--rate", RATE,
                                     "--effective", "2020-01-01")):
        proc = gpuhpc(*args, env=env, unset=NO_DB)
        assert proc.returncode == 0, proc.stderr
    for cmd in (["sacctmgr", "-i", "add", "account", ACCOUNT, "description=efficiency test", "organization=gpuhpc"],
                ["sacctmgr", "-i", "add", "user", os.environ.get("USER") or "root", f"account={ACCOUNT}"]):
        subprocess.run(cmd, capture_output=True, text=True, timeout=60)      # "nothing new" on a rerun
    client = SlurmClient()
    # ten seconds of one busy core (the CPU series the Slurm exporter reads from sstat), then idle. The
    # batch shell spins itself and lives on: jobacct_gather/linux counts the CPU of the processes alive
    # at a poll, and the exporter's sstat (which polls) runs every 30 s, so a busy child that ended
    # between two polls would never be counted.
    script = "#!/bin/bash\nend=$((SECONDS + 10)); while [ $SECONDS -lt $end ]; do :; done\nsleep 600\n"
    job = client.submit_script(script, extra=[
        "--partition=gpu", "--nodes=1", "--gres=gpu:h100:4", f"--account={ACCOUNT}", "--time=10",
        f"--job-name={NAME}", f"--output={tmp}/%j.out"])
    idx: dict[str, list[int]] = {}
    saved: dict[str, str] = {}
    try:
        wait_for(lambda: (rows := client.queue(job_ids=[job])) and rows[0].state.raw == "RUNNING", 120,
                 lambda: f"job {job} to start (now {client.queue(job_ids=[job])})", interval=1)
        idx = client.job_gpu_indexes(job)
        (node, gpus), = idx.items()
        saved[node] = (STATE_DIR / f"{node}.json").read_text()
        st = json.loads(saved[node])
        for i in gpus[:2]:
            st["gpus"][i]["util"] = 88
            st["gpus"][i]["memory_used"] = 30 * 10**9
        nvml_standin.write_state(str(STATE_DIR / f"{node}.json"), st)
        busy_at = time.time()
        _hook("prolog", node, job, gpus)
        t_map = time.monotonic()
        # the waste alert fired (the local rules' `for: 20s`, scripts/services/prometheus.sh) for exactly
        # the two idle GPUs; the notifier (run twice, as cron would) writes each once, priced
        waste_log = tmp / "waste.log"

        def notified() -> list[dict]:
            proc = subprocess.run([sys.executable, "-m", "gpuhpc.monitoring.notify", "--log", str(waste_log),
                                   "--state", str(tmp / "sent.json")], env=env, capture_output=True, text=True,
                                  timeout=60)
            assert proc.returncode == 0, proc.stderr
            return [json.loads(line) for line in waste_log.read_text().splitlines()] if waste_log.exists() else []

        def decided() -> bool:
            """What the tests below need is in: the job's report (as `report efficiency` gives it
            while the job runs) has 2 idle GPUs with >= 34 s of idle samples each (the tests' lower
            bound is 30 s), 2 busy ones, an sstat sample after the busy loop (JobAcctGatherFrequency
            30 s), and the notifier has written the alert for both idle GPUs."""
            if time.monotonic() - t_map < 30:
                return False
            proc = gpuhpc("report", "efficiency", job, "--json", env=env, unset=NO_DB)
            if proc.returncode != 0:
                return False
            rep = json.loads(proc.stdout)
            idle = [d for d in rep["devices"] if d["idle"]]
            busy = [d for d in rep["devices"] if not d["idle"]]
            return (len(idle) == 2 and min(d["idle_gpu_hours"] for d in idle) >= 0.0095     # 34 s (4 decimals)
                    and len(busy) == 2
                    and bool(rep["cpu_used_seconds"]) and bool(rep["peak_rss_bytes"])
                    and len([w for w in notified() if w["job_id"] == job]) >= 2)

        # a loaded machine may evaluate the rule late
        wait_for(decided, 120, f"job {job}'s idle/busy figures and both waste alerts", interval=2)
        waste = notified()                         # once more: nothing is sent twice
    finally:
        client.cancel(job)
        for node, gpus in idx.items():
            _hook("epilog", node, job, gpus)
        for node, text in saved.items():
            (STATE_DIR / f"{node}.json").write_text(text)
    rows = wait_for(lambda: (rows := [r for r in client.accounting(job_ids=[job]) if r.job_id == job])
                    and rows[0].end not in ("", "Unknown") and rows, 60, f"sacct to have job {job}'s end time",
                    interval=1)
    env["GPUHPC_TEST_JOB_START"] = rows[0].start
    env["GPUHPC_TEST_JOB_END"] = rows[0].end
    env["GPUHPC_TEST_BUSY_AT"] = str(busy_at)
    return job, node, gpus, env, waste


def test_report_names_idle_gpus_and_their_cost(half_idle_job):
    job, node, gpus, env, _ = half_idle_job
    proc = gpuhpc("report", "efficiency", job, "--json", env=env, unset=NO_DB)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["gpus"] == 4 and rep["gpu_type"] == "h100" and rep["account"] == ACCOUNT
    devs = {int(d["gpu"]): d for d in rep["devices"]}
    assert sorted(devs) == gpus
    assert [i for i in gpus if devs[i]["idle"]] == gpus[2:]
    # the busy pair: 0 % from the job's start until the state above was written (seconds, more on a
    # loaded machine), 88 % after. So each mean is 88 % weighted by its samples that were not idle,
    # and its idle samples all lie before that write (one 5 s scrape and one step late at most).
    start = dt.datetime.fromisoformat(env["GPUHPC_TEST_JOB_START"]).astimezone().timestamp()
    before_busy = float(env["GPUHPC_TEST_BUSY_AT"]) - start
    for i in gpus[:2]:
        d = devs[i]
        assert d["peak_util_percent"] == 88 and d["peak_memory_bytes"] == 30e9, d
        assert d["mean_util_percent"] == pytest.approx(88 * (1 - d["idle_gpu_hours"] / d["held_gpu_hours"]), abs=1), d
        assert d["idle_gpu_hours"] * 3600 <= before_busy + 12, (d, before_busy)
        assert (d["held_gpu_hours"] - d["idle_gpu_hours"]) * 3600 >= 25, d          # and >= 25 s busy
    lo, hi = gpus[2], gpus[3]
    assert f"GPUs {lo}, {hi} were idle: ask for 2" in rep["advice"], rep["advice"]
    assert rep["rate_per_gpu_hour"] == "2.500000"
    idle_h = rep["idle_gpu_hours"]
    assert 2 * 30 / 3600 <= idle_h <= 2 * 180 / 3600, idle_h      # two GPUs, 45 s (up to ~105 s on a loaded machine)
    assert float(rep["idle_cost"]) == pytest.approx(idle_h * 2.5, abs=0.011)
    # sstat, every 30 s: the 10 s busy loop gets what CPU a loaded 2-core machine leaves it
    assert rep["cpus"] > 0 and rep["cpu_used_seconds"] and rep["cpu_used_seconds"] > 0, rep
    assert rep["peak_rss_bytes"] and rep["peak_rss_bytes"] > 0
    text = gpuhpc("report", "efficiency", job, env=env, unset=NO_DB)
    assert text.returncode == 0 and "IDLE" in text.stdout and "advice: GPUs" in text.stdout


def test_weekly_ranking_puts_it_first(half_idle_job):
    job, _, _, env, _ = half_idle_job
    proc = gpuhpc("report", "efficiency", "--account", ACCOUNT, "--period", "week", "--json", env=env, unset=NO_DB)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows and any(r["job_id"] == job for r in rows)
    hours = [r["idle_gpu_hours"] for r in rows]
    assert hours == sorted(hours, reverse=True)
    # first, unless an earlier run of this very test (same name) idled longer
    ahead = [r["job_id"] for r in rows[: [r["job_id"] for r in rows].index(job)]]
    names = {r.job_id: r.name for r in SlurmClient().accounting(job_ids=ahead)} if ahead else {}
    assert all(names.get(j) == NAME for j in ahead), (ahead, names)
    assert {r["account"] for r in rows} == {ACCOUNT}


def test_bad_input_exits_2():
    for args in (("report", "efficiency"), ("report", "efficiency", "12x"),
                 ("report", "efficiency", "--account", "research", "--period", "year")):
        proc = gpuhpc(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", f"--user-data-dir={tmp_path / 'profile'}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def test_html_page_renders_its_charts_in_headless_chromium(half_idle_job, tmp_path):
    from PIL import Image

    job, _, _, env, _ = half_idle_job
    page = tmp_path / "eff.html"
    proc = gpuhpc("report", "efficiency", job, "--html", str(page), env=env, unset=NO_DB)
    assert proc.returncode == 0, proc.stderr
    # the console check sees a console error when there is one
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><script>console.error("gpuhpc-probe")</script></body></html>')
    assert any("gpuhpc-probe" in line for line in _console(_chromium(tmp_path, bad, "--dump-dom").stderr))

    dom = _chromium(tmp_path, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not _console(dom.stderr), _console(dom.stderr)
    assert dom.stdout.count("<svg") >= 2 and dom.stdout.count("<path") > 10
    assert f"Job {job}: GPU efficiency" in dom.stdout and "were idle: ask for 2" in dom.stdout

    shot = tmp_path / "eff.png"
    run = _chromium(tmp_path, page, "--window-size=1000,1600", f"--screenshot={shot}")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    assert not _console(run.stderr)
    img = Image.open(shot).convert("RGB")
    px = img.tobytes()              # the page is black, grey and white except for the charts' lines
    colored = sum(1 for i in range(0, len(px), 3) if max(px[i:i + 3]) - min(px[i:i + 3]) > 60)
    assert colored > 500, "no coloured chart lines drawn"


def test_waste_alert_fires_and_the_notifier_names_job_user_gpu_and_cost(half_idle_job):
    job, node, gpus, _, waste = half_idle_job
    mine = [w for w in waste if w["job_id"] == job]
    assert sorted((w["node"], int(w["gpu"])) for w in mine) == [(node, g) for g in gpus[2:]], waste
    user = os.environ.get("USER") or "root"
    for w in mine:
        assert w["alert"] == "GpuhpcIdleGpuHeld" and w["state"] == "firing" and w["user"] == user
        assert w["rate_per_gpu_hour"] == "2.500000" and w["idle_cost"] is not None
        assert w["message"].startswith(f"job {job} ({user}) holds idle GPU {w['gpu']} on {node} (h100) for "), w
        assert w["message"].endswith(f"{float(w['idle_cost']):,.2f} so far at 2.50/GPU-hour"), w


def test_ledger_keeps_the_summary_when_prometheus_is_gone(half_idle_job):
    """`gpuhpc ledger ingest` stores the settled run's utilisation summary next to its charge;
    with Prometheus unreachable (a dead URL) the one-job report (advice, idle cost) and the
    weekly ranking still come out, from the ledger."""
    from gpuhpc.monitoring.efficiency import Prometheus
    from gpuhpc.monitoring.summaries import settle_lag

    job, node, gpus, env, _ = half_idle_job
    end = dt.datetime.fromisoformat(env["GPUHPC_TEST_JOB_END"]).astimezone()
    wait = (end + settle_lag(Prometheus()) - dt.datetime.now().astimezone()).total_seconds() + 1
    if wait > 0:                    # the exporter's last scrape of the run must be in Prometheus
        time.sleep(wait)
    since = (dt.datetime.fromisoformat(env["GPUHPC_TEST_JOB_START"]) - dt.timedelta(minutes=1)).isoformat()
    proc = gpuhpc("ledger", "ingest", "--since", since, "--json", env=env, unset=NO_DB)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["utilisation"] >= 1, proc.stdout
    again = gpuhpc("ledger", "ingest", "--since", since, "--json", env=env, unset=NO_DB)
    assert again.returncode == 0, again.stderr
    path = subprocess.run([sys.executable, "-c", "from gpuhpc.ledger.paths import default_db_path as p; print(p())"],
                          env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    with sqlite3.connect(path) as conn:         # stored once, though two ingests saw the run
        (n,) = conn.execute("SELECT count(*) FROM run_utilisation r JOIN usage_records u ON u.id = r.usage_id "
                            "WHERE u.job_id = ?", (job,)).fetchone()
    assert n == 1

    dead = {**env, "GPUHPC_PROMETHEUS_URL": "http://127.0.0.1:9"}
    proc = gpuhpc("report", "efficiency", job, "--json", env=dead, unset=NO_DB)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["source"] == "ledger"
    devs = {int(d["gpu"]): d for d in rep["devices"]}
    assert sorted(devs) == gpus and [i for i in gpus if devs[i]["idle"]] == gpus[2:]
    assert all(devs[i]["peak_util_percent"] == 88 and devs[i]["peak_memory_bytes"] == 30e9 for i in gpus[:2])
    assert f"GPUs {gpus[2]}, {gpus[3]} were idle: ask for 2" in rep["advice"], rep["advice"]
    assert rep["rate_per_gpu_hour"] == "2.500000" and float(rep["idle_cost"]) > 0
    assert float(rep["idle_cost"]) == pytest.approx(rep["idle_gpu_hours"] * 2.5, abs=0.011)

    proc = gpuhpc("report", "efficiency", "--account", ACCOUNT, "--period", "week", "--json", env=dead, unset=NO_DB)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    ids = [r["job_id"] for r in rows]
    assert job in ids and all(r["source"] == "ledger" for r in rows), rows
    ahead = ids[:ids.index(job)]        # first, unless an earlier run of this test ended inside --since
    names = {r.job_id: r.name for r in SlurmClient().accounting(job_ids=ahead)} if ahead else {}
    assert all(names.get(j) == NAME for j in ahead), (ahead, names)
    assert "127.0.0.1:9" in proc.stderr        # says that jobs not settled yet are missing
