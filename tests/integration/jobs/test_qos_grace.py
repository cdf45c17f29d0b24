"""A preempt/qos preemption gives the program the QOS's grace time (issue 21, point 11).

Slurm allows one PreemptType per cluster and the shared one uses preempt/partition_prio, so this
test stands up a private one-node controller (own ports, state and logs under the test's dir,
PreemptType=preempt/qos, the shared munged and slurmdbd; no Ansible, a few seconds) with a
partition whose GraceTime is 0 and a QOS `…-low` with GraceTime=40 that `…-high` preempts. A
gpuhpc job in the low QOS is preempted by a high one: its deadline is the QOS's 40 s (Slurm's
EndTime), where the template once took the partition's 0 s. Everything it adds to slurmdbd (a
cluster, two QOS, an account) is removed afterwards."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner
from jobs_helpers import gpuhpc
from polling import wait_for

pytestmark = pytest.mark.integration

NAME = "gpuhpcqos"
LOW, HIGH, QOS_GRACE = f"{NAME}-low", f"{NAME}-high", 40
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16927, 16928, 17321


def _shared_config() -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=True).stdout
    return {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.splitlines()) if v}


def _conf(base: Path, shared: dict[str, str]) -> str:
    return f"""ClusterName={NAME}
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo={shared.get("AuthInfo", "(null)").replace("(null)", "")}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldParameters=preempt_send_user_signal
SchedulerParameters=batch_sched_delay=0,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/qos
PreemptMode=REQUEUE
JobRequeue=1
KillWait=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={shared["AccountingStorageHost"]}
AccountingStoragePort={shared["AccountingStoragePort"]}
JobAcctGatherType=jobacct_gather/none
NodeName=qos-node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={NODE_PORT} CPUs=1 RealMemory=1000 State=UNKNOWN
PartitionName=qos Nodes=qos-node1 Default=YES GraceTime=0 PreemptMode=REQUEUE MaxTime=INFINITE State=UP
"""


def _stop(base: Path) -> None:
    for name in ("slurmd-qos-node1.pid", "slurmctld.pid"):
        try:
            pid = int((base / "run" / name).read_text())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, f"{name} to stop")


@pytest.fixture
def qos_cluster():
    # short: slurmstepd's socket lives in the spool dir, and a Unix socket path has 108 bytes
    base = Path(tempfile.mkdtemp(prefix="gpuhpc-qos-", dir="/var/tmp"))
    for d in ("state", "spool", "log", "run"):
        (base / d).mkdir(parents=True)
    conf = base / "slurm.conf"
    conf.write_text(_conf(base, _shared_config()))
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def sacctmgr(*args: str, check: bool = True) -> None:
        subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True, text=True, timeout=60, check=check)

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
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, timeout=60)
        subprocess.run(["slurmd", "-f", str(conf), "-N", "qos-node1"], env=env, check=True, timeout=60)
        client = SlurmClient(LocalRunner(env={"SLURM_CONF": str(conf)}))
        wait_for(lambda: "idle" in client.run(["sinfo", "-h", "-o", "%t"], check=False).stdout, 60,
                 "the private preempt/qos cluster's node to be idle")
        yield client, env
    finally:
        client = SlurmClient(LocalRunner(env={"SLURM_CONF": str(conf)}))
        ids = client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        for job_id in ids:                       # the private cluster's own jobs, by id
            client.run(["scancel", job_id], check=False)
        if ids:
            wait_for(lambda: not client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split(), 60,
                     "the private cluster's jobs to end")
        # a job the database still counts as running keeps the cluster from being deleted
        sacctmgr("list", "runawayjobs", f"cluster={NAME}", check=False)
        client.run(["scontrol", "shutdown"], check=False)
        _stop(base)
        forget()
        shutil.rmtree(base, ignore_errors=True)


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
