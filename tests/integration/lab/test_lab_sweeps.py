"""Issue 21 "sweep state that is safe on a shared filesystem", across real hosts (see conftest.py):
gpuhpc installed the way a site does it (the gpuhpc.cluster.login play, offline from a wheelhouse,
into a prefix on the shared filesystem so that compute hosts run the same interpreter), an ordinary
user on the login host, the sweep's driver job on c1 or c2.

- With the default SQLite state, a sweep that needs its driver is refused in one line (exit 2)
  naming GPUHPC_DB_URL and PostgreSQL: nothing submitted, no sweep written.
- With GPUHPC_DB_URL on a PostgreSQL server on the lab's network (a private one, in the switch
  namespace at 10.213.0.1, password auth), the sweep completes: the driver on a compute host
  submits the later arrays and writes the state; `sweep wait` on the login host exits 0; every
  trial ran exactly once.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from polling import wait_for

from .conftest import LAB_DIR, LAB_SH, REPO, SHARED, Lab

pytestmark = pytest.mark.integration

USER, UID = "sweeper", 2101
HOME = f"/shared/home/{USER}"
HOME_HERE = SHARED / "home" / USER     # the same directory, as this machine sees it
# software on the shared filesystem: the venv the driver and the trials run with (the submitter's
# sys.executable) has the same path on every host
PREFIX = "/shared/gpuhpc"
TRIALS, PARALLELISM, CHUNK = 8, 2, 2
SWEEP = f"""\
name: lab-sweep
command: bash trial.sh {{x}}
parameters:
  x: {{type: int, low: 0, high: {TRIALS - 1}}}
method: grid
parallelism: {PARALLELISM}
chunk_size: {CHUNK}             # 4 arrays: the first from the login host, the rest from the driver
resources: {{time: 5m}}
metric: {{name: loss, goal: minimize}}
"""
TRIAL = """\
#!/bin/bash
sleep 1
echo "$1 $(hostname) $SLURM_JOB_ID" >> ran.txt
"""


def _local(*argv: str, env: dict | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout


def as_user(lab: Lab, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``command`` in a login shell of the lab's user on the login host (its home, on /shared)."""
    return lab.sh("ssh", "login", f"runuser -l {USER} -c {shlex.quote(command)}", check=False, timeout=timeout)


def _pg(env: dict, cmd: str) -> str:
    """scripts/services/postgres.sh CMD in the lab's switch namespace (scripts/lab.sh ctl)."""
    return _local("bash", str(LAB_SH), "ctl", "env", *(f"{k}={v}" for k, v in env.items()), "bash",
                  str(REPO / "scripts" / "services" / "postgres.sh"), cmd, timeout=120)


@pytest.fixture(scope="module")
def site(lab: Lab):
    """gpuhpc on the lab (login play, wheelhouse), a user on every host, PostgreSQL on 10.213.0.1."""
    # 1. the wheelhouse for the hosts' Python, dependencies downloaded once per $LAB (cached by key)
    pyv = lab.ssh("login", "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'").strip()
    lab.timed("sweeps_wheelhouse_s", _local, "bash", str(REPO / "scripts" / "wheelhouse.sh"),
              str(SHARED / "wheelhouse"), pyv, str(LAB_DIR / "wheelhouse-cache"),
              env={**os.environ, "PYTHON": sys.executable})
    # a fresh install every session: the venv on /shared outlives the hosts (lab.sh wipe)
    shutil.rmtree(SHARED / PREFIX.removeprefix("/shared/"), ignore_errors=True)
    play = lab.timed("sweeps_login_play_s", lab.play, "-e", json.dumps(
        {"gpuhpc_login_prefix": PREFIX, "gpuhpc_login_wheelhouse": "/shared/wheelhouse"}),
        playbook="gpuhpc.cluster.login", timeout=600)
    assert play.returncode == 0, play.stdout[-6000:]

    # 2. an ordinary user: the same uid on every host, its home on the shared filesystem, an association
    home = HOME_HERE
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    for h in ("ctl", "login", "c1", "c2"):
        lab.ssh(h, f"id {USER} >/dev/null 2>&1 || {{ groupadd -g {UID} {USER} && "
                   f"useradd -u {UID} -g {UID} -d {HOME} -M -s /bin/bash {USER}; }}")
    lab.ssh("ctl", f"sacctmgr -i add user {USER} account=lab >/dev/null 2>&1 || true; "
                   f"sacctmgr -nP show assoc user={USER} format=account | grep -qx lab")
    work = home / "work"
    work.mkdir()
    (work / "sweep.yaml").write_text(SWEEP)
    (work / "trial.sh").write_text(TRIAL)

    # 3. PostgreSQL on the lab's network: the existing helper, in the switch namespace
    d = LAB_DIR / "pg-sweeps"
    if d.exists():      # a session that was killed: its server goes first
        _pg({"D": str(d), "PGPASSFILE": str(d / "pgpass")}, "wipe")
        shutil.rmtree(d)
    port = lab.sh("ctl", "python3", "-c", "import socket; s = socket.socket(); s.bind(('10.213.0.1', 0)); "
                                          "print(s.getsockname()[1])").stdout.strip()
    env = {"D": str(d), "PORT": port, "PGPASSFILE": str(d / "pgpass"), "PG_LISTEN": "10.213.0.1",
           "PG_HBA_NET": "10.213.0.0/24"}
    try:
        url = lab.timed("sweeps_pg_start_s", _pg, env, "start").strip().splitlines()[-1]
        url = url.replace("@127.0.0.1:", "@10.213.0.1:")
        # the user's credentials in a file of its own; a short driver poll for trials of a second
        with open(os.open(home / "db.env", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(f"export GPUHPC_DB_URL={shlex.quote(url)}\nexport GPUHPC_SWEEP_DRIVER_POLL=2\n")
        _local("chown", "-R", f"{UID}:{UID}", str(home))
        yield {"url": url}
    finally:
        lab.ssh("ctl", f"scancel -u {USER}", check=False)
        _pg(env, "wipe")
        shutil.rmtree(d, ignore_errors=True)


def test_sqlite_state_is_refused_when_the_driver_may_run_on_another_host(lab: Lab, site):
    t = time.monotonic()
    run = as_user(lab, "cd work && gpuhpc sweep run sweep.yaml")
    lab.timings["sweeps_refusal_s"] = round(time.monotonic() - t, 1)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, (run.returncode, run.stdout, run.stderr)
    sys.stderr.write(f"\nrefusal: {lines[0]}\n")
    assert "GPUHPC_DB_URL" in lines[0] and "PostgreSQL" in lines[0], lines
    # nothing submitted, no sweep written (the SQLite file may hold the ledger's tables, no sweep)
    assert as_user(lab, f"squeue --noheader --user={USER}").stdout.strip() == ""
    data = HOME_HERE / ".local" / "share" / "gpuhpc"     # the user's data dir
    db = data / "ledger.db"
    if db.exists():
        with sqlite3.connect(db) as c:
            if c.execute("SELECT 1 FROM sqlite_master WHERE name = 'sweeps'").fetchone():
                assert c.execute("SELECT count(*) FROM sweeps").fetchone()[0] == 0
    assert not (data / "sweeps").exists() or not any((data / "sweeps").iterdir())


def test_sweep_with_its_driver_on_a_compute_host_writes_its_state_to_postgresql(lab: Lab, site):
    up = as_user(lab, ". ./db.env && gpuhpc db upgrade")
    assert up.returncode == 0, up.stderr
    t = time.monotonic()
    run = as_user(lab, ". ./db.env && cd work && gpuhpc sweep run sweep.yaml --json")
    assert run.returncode == 0, (run.stdout, run.stderr)
    sid = json.loads(run.stdout)["sweep_id"]
    wait = as_user(lab, f". ./db.env && gpuhpc sweep wait {sid} --timeout 300 --poll 1", timeout=360)
    wall = time.monotonic() - t
    lab.timings["sweeps_sweep_s"] = round(wall, 1)
    assert wait.returncode == 0, (wait.stdout, wait.stderr)
    res = as_user(lab, f". ./db.env && gpuhpc sweep results {sid} --json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert sorted(r["trial"] for r in rows) == list(range(TRIALS)), rows
    assert all(r["state"] == "completed" and r["restarts"] == 0 for r in rows), rows
    # every trial ran exactly once, on the compute hosts
    ran = [line.split() for line in (HOME_HERE / "work" / "ran.txt").read_text().splitlines()]
    assert sorted(int(x) for x, _, _ in ran) == list(range(TRIALS)), ran
    assert {h for _, h, _ in ran} <= {"c1", "c2"}, ran
    arrays = {r["job_id"].split("_")[0] for r in rows}
    assert len(arrays) == TRIALS // CHUNK, rows          # the later arrays came from the driver
    # the driver ran on a compute host: a host other than the login host wrote the sweep's state
    status = as_user(lab, f". ./db.env && gpuhpc sweep status {sid} --json")
    assert status.returncode == 0, status.stderr
    driver_job = json.loads(status.stdout)["driver_job_id"]

    def driver():
        rows = lab.ssh("login", f"sacct --noheader --parsable2 -X --jobs={driver_job} --format=NodeList,State"
                       ).strip().splitlines()
        return rows if len(rows) == 1 and rows[0].split("|")[1] not in ("PENDING", "RUNNING") else None

    node, state = wait_for(driver, 60, f"sweep {sid}'s driver job {driver_job} to end")[0].split("|")
    assert node in ("c1", "c2") and state == "COMPLETED", (node, state)
    # ... and submitted every array after the first, which it recorded in PostgreSQL from there
    logs = HOME_HERE / ".local/share/gpuhpc/sweeps" / str(sid) / "logs"
    log = (logs / f"lab-sweep-s{sid}-driver-{driver_job}.out").read_text()
    submitted = set(re.findall(r"submitted \d+ trial\(s\) as (\d+)", log))
    assert len(submitted) == len(arrays) - 1 and submitted < arrays, (log, arrays)
    sys.stderr.write(f"\nsweep {sid}: {TRIALS} trials, parallelism {PARALLELISM}, {len(arrays)} arrays, "
                     f"{wall:.1f} s from `sweep run` to `sweep wait`'s exit 0; driver job {driver_job} on {node} "
                     f"submitted {len(submitted)} of them\n")
