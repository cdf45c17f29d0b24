"""Issue 26 point 4: root's ``ledger ingest`` reads a shared, world-writable metrics directory.

The throwaway user plants, with its own tools: a FIFO (which blocked ingest forever), a symlink
to /dev/zero (which exhausted memory), a file claiming another user's job, a file for a job
accounting does not know, a line inside its own file about someone else's job, and a symlinked
cluster directory. Root's ``ingest_metrics`` returns promptly, reads only the user's own file
for the user's own job, and every other user's figures are unchanged.

Point 11 (sync-slurm): the role's wrapper runs ``sync-slurm`` under its own lock, so an ingest
that is stuck (its lock held) does not keep the budgets from Slurm.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from gpuhpc.ledger import db, ingest
from gpuhpc.ledger.orm import JobMetric, UsageRecord

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _usage(url: str, job: str, user: str) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    with db.session_scope(url) as s:
        s.add(UsageRecord(cluster="local", job_id=job, array_task_id=-1, run_start=now, run_end=now, state="COMPLETED",
                          elapsed_s=60, user_name=user, account_name="research", partition="gpu", qos="normal",
                          gpu_type="h100", gpus=1, job_name="x", gpu_hours=Decimal("0.016667"), amount=Decimal(0),
                          priced=False))


def _line(job: str, value: float) -> str:
    return json.dumps({"cluster": "local", "job_id": job, "array_task_id": None, "metrics": {"samples_per_s": value}})


@pytest.fixture()
def request_cleanup():
    paths: list[Path] = []
    yield paths
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def test_planted_metrics_files_are_skipped_and_never_block(hostile, tmp_path, request_cleanup):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    db.upgrade(url)
    _usage(url, "9001", hostile.name)            # the attacker's own job
    _usage(url, "9002", "root")                  # a victim's job, with its real figure
    _usage(url, "9003", hostile.name)
    _usage(url, "9004", hostile.name)
    # a shared directory: world-writable, sticky (where the user can reach it: not under root's tmp_path)
    shared = Path(tempfile.mkdtemp(prefix="gpuhpc-shared-metrics-", dir="/var/tmp"))
    request_cleanup.append(shared)
    (shared / "local").mkdir()
    for d in (shared, shared / "local"):
        os.chmod(d, 0o1777)
    (shared / "local" / "9002.jsonl").write_text(_line("9002", 100.0) + "\n")          # root's own file
    plant = "; ".join([
        "cd " + shlex.quote(str(shared / "local")),
        f"printf '%s\\n' {shlex.quote(_line('9001', 5.0))} {shlex.quote(_line('9002', 1e12))} > 9001.jsonl",
        "mkfifo 9003.jsonl",                                      # blocked ingest for ever
        "ln -s /dev/zero 9004.jsonl",                             # exhausted memory
        f"printf '%s\\n' {shlex.quote(_line('9005', 1e12))} > 9005.jsonl",   # no such job
        f"printf '%s\\n' {shlex.quote(_line('9002', 1e12))} > 9002_0.jsonl",  # the victim's job, as a task
        "mkdir ../other && ln -s ../other ../evil",               # a symlinked cluster directory
    ])
    r = hostile.run(["bash", "-c", plant])
    assert r.returncode == 0, r.stderr
    # root's ingest, in a thread: a FIFO read would block for ever, so a hang fails the test instead
    result: list = []
    t = threading.Thread(target=lambda: result.append(ingest.ingest_metrics(shared, url=url)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "ingest_metrics blocked on a planted file"
    assert result == [2]
    with db.session_scope(url) as s:
        got = {(m.job_id, m.array_task_id): (m.value, m.samples) for m in s.query(JobMetric)}
    # the attacker's own job got its own figure only; the victim's figure is its own file's
    assert got == {("9001", -1): (5.0, 1), ("9002", -1): (100.0, 1)}


def test_sync_slurm_runs_while_an_ingest_is_stuck(tmp_path):
    """The role's wrapper: ingest and sync-slurm hold different locks; a held ingest lock (a stuck
    ingest) skips the next ingest, not sync-slurm."""
    import jinja2

    src = (REPO / "ansible/roles/gpuhpc_ledger/templates/gpuhpc-ledger-ingest.sh.j2").read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["quote"] = lambda v: shlex.quote(str(v))
    stub = tmp_path / "gpuhpc"
    stub.write_text("#!/bin/bash\necho \"gpuhpc $*\"\n")
    stub.chmod(0o755)
    (tmp_path / "ledger.env").write_text("")
    wrapper = tmp_path / "gpuhpc-ledger-ingest"
    wrapper.write_text(env.from_string(src).render(ansible_managed="test", gpuhpc_ledger_config_dir=str(tmp_path),
                                                   gpuhpc_ledger_data_dir=str(tmp_path), gpuhpc_ledger_bin=str(stub),
                                                   gpuhpc_ledger_textfile_dir=""))
    wrapper.chmod(0o755)
    import fcntl

    with open(tmp_path / ".ingest.lock", "w") as held:          # an ingest that never ends
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = subprocess.run([str(wrapper)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "previous ingest still running" in r.stdout and "gpuhpc ledger" not in r.stdout
        r = subprocess.run([str(wrapper), "sync-slurm"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "gpuhpc ledger sync-slurm" in r.stdout, r.stdout + r.stderr
    assert oct((tmp_path / ".sync-slurm.lock").stat().st_mode & 0o777) == "0o600"
    r = subprocess.run([str(wrapper), "rm -rf"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
