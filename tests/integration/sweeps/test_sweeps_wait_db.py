"""``gpuhpc sweep wait`` and ``gpuhpc sweep status`` ride out a sweep database that stops
answering (issue 21): a PostgreSQL restart while they wait is retried with a growing pause, and
a database that stays down ends them with one line and exit 1 once ``GPUHPC_SWEEP_DB_RETRY``
has passed.

No Slurm: the sweep is written straight into a private PostgreSQL server (``private_pg``, the
test's own, stopped and started at will) as a running sweep whose driver's heartbeat is fresh,
so both commands read only what the driver wrote; the test then plays the driver's last round."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]


def _running_sweep(url: str, tmp_path) -> int:
    """A running sweep of 2 trials (one completed, one running) with a driver job recorded."""
    from gpuhpc.sweeps import store
    from gpuhpc.sweeps.spec import SweepSpec, spec_json

    spec = SweepSpec.from_mapping({"name": "t-waitdb", "command": "true", "method": "grid",
                                   "parameters": {"x": {"type": "int", "low": 0, "high": 1}},
                                   "resources": {"partition": "cpu", "time": "5m"}, "metric": {"name": "loss"}})
    conn = store.connect(url)
    try:
        with conn.transaction() as tx:
            t = tx.ts(store.now())
            sid = tx.insert("INSERT INTO sweeps (name, user_name, cluster, spec, kind, status, message, directory, "
                            "n_trials, driver_job_id, created_at, updated_at) VALUES (?, 'root', 'default', ?, "
                            "'command', 'running', NULL, ?, 2, '999999', ?, ?)",
                            (spec.name, spec_json(spec), str(tmp_path / "sweep"), t, t))
            for n, state in ((0, "completed"), (1, "running")):
                tx.execute("INSERT INTO sweep_trials (sweep_id, number, params, state, attempts, restarts, gpu_hours, "
                     "updated_at) VALUES (?, ?, ?, ?, 1, 0, ?, ?)", (sid, n, f'{{"x": {n}}}', state,
                                                                    tx.num(0), t))
    finally:
        conn.close()
    return sid


def _finish(url: str, sid: int) -> None:
    """The driver's last round: the running trial completed, the sweep done."""
    from gpuhpc.sweeps import store

    conn = store.connect(url)
    try:
        with conn.transaction() as tx:
            tx.execute("UPDATE sweep_trials SET state = 'completed' WHERE sweep_id = ?", (sid,))
            tx.execute("UPDATE sweeps SET status = 'done', updated_at = ? WHERE id = ?", (tx.ts(store.now()), sid))
    finally:
        conn.close()


def _cli(*args: str, err) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuhpc", "sweep", *args], stdout=subprocess.PIPE,
                            stderr=err, text=True, env=dict(os.environ))


def test_wait_and_status_retry_through_a_postgresql_restart(private_pg, tmp_path, monkeypatch):
    """PostgreSQL stops under a `sweep wait` (and a `sweep status` starts while it is down):
    both say once that they retry, carry on when it is back, and `wait` exits 0 when the
    sweep ends."""
    url, pg = private_pg
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "60")       # the driver's heartbeat stays fresh throughout
    sid = _running_sweep(url, tmp_path)
    waits, stats = tmp_path / "wait.err", tmp_path / "status.err"
    with open(waits, "w") as werr, open(stats, "w") as serr:
        waiter = _cli("wait", str(sid), "--poll", "1", err=werr)
        try:
            pg("stop")
            try:
                wait_for(lambda: "retrying" in waits.read_text(), 60, "sweep wait to retry the lost database")
                status = _cli("status", str(sid), "--json", err=serr)
                wait_for(lambda: "retrying" in stats.read_text(), 60, "sweep status to retry the lost database")
                assert waiter.poll() is None and status.poll() is None, (waits.read_text(), stats.read_text())
            finally:
                pg("start")
            out, _ = status.communicate(timeout=90)
            assert status.returncode == 0, stats.read_text()
            assert '"running": 1' in out and '"completed": 1' in out, out
            _finish(url, sid)
            waiter.wait(timeout=90)
        finally:
            if waiter.poll() is None:
                waiter.kill()
    assert waiter.returncode == 0, waits.read_text()
    text = waits.read_text()
    # the sweep tables' one data path (DB-API, issue 40.11) names a server it cannot reach in one line
    assert text.count("retrying") == 1 and "LedgerUnwritable: cannot connect to the ledger database" in text, text


def test_a_database_that_stays_down_ends_wait_and_status_with_one_line(private_pg, tmp_path, monkeypatch):
    """With the database down for longer than GPUHPC_SWEEP_DB_RETRY, both exit 1 with one
    line that names the database setting."""
    url, pg = private_pg
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "60")
    monkeypatch.setenv("GPUHPC_SWEEP_DB_RETRY", "3")
    sid = _running_sweep(url, tmp_path)
    pg("stop")
    try:
        for args in (("wait", str(sid), "--poll", "1"), ("status", str(sid))):
            res = subprocess.run([sys.executable, "-m", "gpuhpc", "sweep", *args], capture_output=True, text=True,
                                 timeout=120)
            last = res.stderr.strip().splitlines()[-1]
            assert res.returncode == 1, res.stderr
            assert "kept failing for 3s" in last and "GPUHPC_DB_URL" in last, res.stderr
    finally:
        pg("start")
