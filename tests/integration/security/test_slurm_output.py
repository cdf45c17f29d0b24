"""Issue 26 point 2: a job name cannot break or forge gpuhpc's reading of Slurm.

The throwaway user submits, with plain ``sbatch -J`` (any bytes), held jobs named with U+2028 and
0x1f, and with a newline followed by a whole forged squeue row (0x1f-separated, as the old format
was); and one short job on one MIG slice named with a newline followed by a forged sacct row that claims
root, 8 × h100 for 10 hours. Then, as root, ``gpuhpc jobs`` and ``gpuhpc status``, the full-cluster
``squeue`` the Slurm exporter scrapes, a sweep driver's queue read and ``ledger ingest`` all work,
show the names as they are, and no forged row appears; the job is charged to its real user with
its real GPU and time.
"""
from __future__ import annotations

import datetime as dt
import json

import pytest

from cli_helpers import gpuhpc
from gpuhpc.ledger import db, ingest
from gpuhpc.ledger.orm import UsageRecord
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for

pytestmark = pytest.mark.integration

US = "\x1f"
FORGED_SQUEUE = US.join(["424242", "424242", "424242", "N/A", "forged", "COMPLETED", "0:00", "1:00:00", "2",
                         "gres:gpu:h100:8", "gpu", "root", "research", "gpu-node[1-2]", "None", "normal"])
FORGED_SACCT = US.join(["424243", "424243", "forged", "COMPLETED", "10:00:00", "36000", "2026-12-01T00:00:00",
                        "2026-12-01T00:00:00", "2026-12-01T10:00:00",
                        "billing=8,cpu=8,gres/gpu:h100=8,gres/gpu=8,mem=1000M,node=1",
                        "billing=8,cpu=8,gres/gpu:h100=8,gres/gpu=8,mem=1000M,node=1",
                        "gpu", "research", "root", "normal", "local", "10:00:00"])
NAMES = ["bar23\u2028x\x1fy", "a\n" + FORGED_SQUEUE, "b\u2029\x1c\x1d\x1e" + FORGED_SQUEUE + "\n"]
RUN_NAME = "x\n" + FORGED_SACCT


@pytest.fixture(scope="module")
def hostile_jobs(hostile):
    held = {hostile.sbatch("-H", "-p", "cpu", "-t", "1", "-o", "/dev/null", "-J", name, "--wrap", "true"): name
            for name in NAMES}
    # one MIG slice on mig-node1: the node other tests' H100 sweeps leave free
    run = hostile.sbatch("-p", "mig", "--gres=gpu:1g.10gb:1", "-t", "1", "-o", "/dev/null", "-J", RUN_NAME,
                         "--wrap", "sleep 2")
    array = hostile.sbatch("-H", "-p", "cpu", "-t", "1", "-o", "/dev/null", "--array=0-2", "-J", NAMES[1],
                           "--wrap", "true")
    return held, run, array


def test_jobs_status_exporter_and_sweep_reads_survive_hostile_names(hostile, hostile_jobs):
    held, _, array = hostile_jobs
    client = SlurmClient()
    # the full-cluster squeue (the Slurm exporter's, a status view's): every hostile row whole, none forged
    rows = client.queue()
    mine = {r.job_id: r for r in rows if r.user == hostile.name}
    assert {j: mine[j].name for j in held} == held
    assert not [r for r in rows if r.job_id == "424242" or r.name == "forged"]
    # gpuhpc jobs (as root, for that user) and gpuhpc status: exit 0, the names as they are
    r = gpuhpc("jobs", "--user", hostile.name, "--json")
    assert r.returncode == 0, r.stderr
    listed = {j["job_id"]: j["name"] for j in json.loads(r.stdout)}
    assert {j: listed[j] for j in held} == held and "424242" not in listed
    for job in held:
        r = gpuhpc("status", job)
        assert r.returncode == 0, r.stderr
    # the Slurm exporter's scrape succeeds
    from gpuhpc.monitoring.slurm_exporter import SlurmCollector

    fams = {f.name: f for f in SlurmCollector(client).collect()}
    assert fams["gpuhpc_slurm_scrape_ok"].samples[0].value == 1.0
    assert not [s for f in fams.values() for s in f.samples if "424242" in s.labels.values()]
    # a sweep driver's read of the queue (an array named like that, every task)
    from gpuhpc.sweeps.refresh import queue_by_task

    by_task = queue_by_task(client, [array])
    assert by_task is not None and set(by_task) == {(array, 0), (array, 1), (array, 2)}
    assert {r.name for r in by_task.values()} == {NAMES[1]} and {r.user for r in by_task.values()} == {hostile.name}


def test_ledger_ingest_bills_the_real_user_and_resources(hostile, hostile_jobs, tmp_path):
    _, job, _ = hostile_jobs
    client = SlurmClient()
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=30)

    def settled():
        runs = [r for r in client.job_runs(since, job_ids=[job]) if r.job_id == job]
        return runs if runs and runs[-1].state.state.is_finished and runs[-1].end != "Unknown" else None

    runs = wait_for(settled, 300, f"job {job} to finish and reach accounting")
    # slurmdbd can hold a placeholder first (name "allocation", QOS Unknown: a step's record that came
    # before the job's own start record), completed when slurmctld's start record lands
    runs = wait_for(lambda: (lambda rs: rs if rs[-1].qos != "Unknown" else None)(
        [r for r in client.job_runs(since, job_ids=[job]) if r.job_id == job]), 120,
        f"job {job}'s own record (name, QOS) in accounting")
    # sacct kept the newline and 0x1f (slurmdbd cuts a name at 255 bytes); still one row, one name
    assert RUN_NAME.startswith(runs[-1].name) and "\n424243\x1f" in runs[-1].name
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    db.upgrade(url)
    rows = client.job_runs(since, job_ids=[job])          # every user's runs in the window, as ingest reads them
    assert not [r for r in rows if r.job_id == "424243" or r.name == "forged"]
    res = ingest.ingest_rows([r for r in rows if r.job_id == job or r.user == hostile.name], url=url)
    assert res.runs_seen >= 1
    with db.session_scope(url) as s:
        recs = [(u.job_id, u.user_name, u.account_name, u.gpu_type, u.gpus, u.elapsed_s)
                for u in s.query(UsageRecord).filter(UsageRecord.job_id.in_([job, "424243"]))]
    assert len(recs) == 1, recs
    (job_id, user, account, gpu_type, gpus, elapsed) = recs[0]
    assert (job_id, user, account, gpu_type, gpus) == (job, hostile.name, "research", "1g.10gb", 1)
    assert 0 <= elapsed < 120


@pytest.mark.parametrize("name", ["a\u2028b", "a\u2029b", "a\x1fb", "a\nb", "a\x85b", "a\x7f"])
def test_gpuhpc_submit_refuses_separator_and_control_characters_in_a_name(name):
    r = gpuhpc("submit", "--name", name, "-p", "cpu", "-t", "1m", "--", "true")
    assert r.returncode == 2 and r.stderr.startswith("error: name: control character"), r.stderr
    assert r.stderr.count("\n") == 1
    assert not [x for x in SlurmClient().queue(user="root") if x.name == name]      # nothing submitted
