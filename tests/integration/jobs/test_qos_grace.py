"""A preempt/qos preemption gives the program the QOS's grace time (issue 21, point 11).

Slurm allows one PreemptType per cluster and the shared one uses preempt/partition_prio, so this
test stands up a private one-node controller (tests/private_slurm.py: own ports, state and logs,
PreemptType=preempt/qos, the shared munged and slurmdbd; no Ansible, a few seconds) with a
partition whose GraceTime is 0 and a QOS `…-low` with GraceTime=40 that `…-high` preempts. A
gpuhpc job in the low QOS is preempted by a high one: its deadline is the QOS's 40 s (Slurm's
EndTime), where the template once took the partition's 0 s. Everything it adds to slurmdbd (a
cluster, two QOS, an account) is removed afterwards."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from jobs_helpers import gpuhpc
from polling import wait_for
from private_slurm import PrivateSlurm

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcqos"
LOW, HIGH, QOS_GRACE = f"{NAME}-low", f"{NAME}-high", 40
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16927, 16928, 17321


@pytest.fixture
def qos_cluster():
    cluster = PrivateSlurm(
        NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), {"qos-node1": "CPUs=1 RealMemory=1000 State=UNKNOWN"},
        ["PartitionName=qos Nodes=qos-node1 Default=YES GraceTime=0 PreemptMode=REQUEUE MaxTime=INFINITE State=UP"],
        extra={"SlurmdParameters": "config_overrides", "SlurmctldParameters": "preempt_send_user_signal",
               "PreemptType": "preempt/qos", "PreemptMode": "REQUEUE", "JobRequeue": "1", "KillWait": "5"},
        accounting=True)

    def sacctmgr(*args: str, check: bool = True) -> None:
        subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=60, check=check)

    def forget() -> None:
        sacctmgr("delete", "user", "root", f"account={NAME}", f"cluster={NAME}", check=False)
        sacctmgr("delete", "account", NAME, f"cluster={NAME}", check=False)
        sacctmgr("delete", "cluster", NAME, check=False)
        sacctmgr("delete", "qos", HIGH, LOW, check=False)

    forget()                                                  # leftovers of an interrupted run
    try:
        sacctmgr("add", "cluster", NAME)
        sacctmgr("add", "qos", LOW, f"GraceTime={QOS_GRACE}", "PreemptMode=requeue")
        sacctmgr("add", "qos", HIGH, f"Preempt={LOW}")
        sacctmgr("add", "account", NAME, f"cluster={NAME}")
        sacctmgr("add", "user", "root", f"account={NAME}", f"cluster={NAME}", f"qos=normal,{LOW},{HIGH}")
        with cluster.start():
            try:
                yield cluster.client, cluster.env
            finally:
                # a job the database still counts as running keeps the cluster from being deleted
                cluster.cancel_all(wait=60)
                sacctmgr("list", "runawayjobs", f"cluster={NAME}", check=False)
    finally:
        forget()


def test_a_qos_preemption_gives_the_program_the_qos_grace_time(qos_cluster, jobs_env, tmp_path):
    client, env = qos_cluster
    out = tmp_path / "events"
    program = f'trap "echo usr2 >> {out}; exit 0" USR2; echo start >> {out}; while :; do sleep 0.1; done'
    res = gpuhpc("submit", "--partition", "qos", "--qos", LOW, "--time", "10m", "--name", "gpuhpc-test-qos-grace",
                 "--json", "--", "bash", "-c", program, env={"SLURM_CONF": env["SLURM_CONF"]})
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    wait_for(lambda: out.exists() and "start" in out.read_text(), 60,
             f"job {job['job_id']} to start (the private cluster's logs: {os.path.dirname(env['SLURM_CONF'])}/log)")
    client.submit_script("#!/bin/bash\nsleep 1\n", extra=["--partition=qos", f"--qos={HIGH}", "--output=/dev/null",
                                                          "--job-name=gpuhpc-test-qos-preemptor"])
    wait_for(lambda: client.restarts(job["job_id"]) >= 1, 60, f"the preempted job {job['job_id']} to requeue")
    log = Path(job["log"]).read_text()
    m = re.search(r"deadline \S+ \((\d+)s\): the program has (\d+)s", log)
    assert m, log
    left, budget = int(m.group(1)), int(m.group(2))
    print(f"preempt/qos: deadline in {left}s (QOS GraceTime {QOS_GRACE}s, partition 0s), program given {budget}s")
    assert QOS_GRACE - 5 <= left <= QOS_GRACE and budget >= QOS_GRACE - 20, log
    assert "usr2" in out.read_text() and "program exited (0) after SIGUSR2; requeueing job" in log, log
    client.cancel(job["job_id"])
