"""Helpers for the elastic scenarios (conftest.py starts the cluster): a private Slurm controller with cloud nodes for the elastic scenarios (docs/elastic.md).

Like tests/integration/jobs/test_qos_grace.py: its own slurmctld (own ports, state and logs under
a directory in /var/tmp, the shared munged; no accounting), so powering nodes up and down never
touches the shared cluster. One static node runs from the start; four ``State=CLOUD`` nodes in two
price tiers (``spot``: el-spot[1-2], PriorityTier 20; ``od``: el-od[1-2], PriorityTier 10) are
powered up by ``gpuhpc power resume`` with the local provider (``slurmd -D -b -N NAME``) and down
after SuspendTime. Timeouts are short: SuspendTime 6 s, ResumeTimeout 30 s (a slurmd start on a
loaded CI machine has taken 16 s)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuhpc.elastic.config import load_config
from gpuhpc.elastic.providers.local import LocalProvider
from gpuhpc.elastic.reconcile import reconcile_once
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.power import PowerSlurm
from gpuhpc.transport.local import LocalRunner
from polling import wait_for

REPO = Path(__file__).resolve().parents[3]
NAME = "gpuhpcel"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16957, 16958, 17361    # unlike every other private cluster's (grep before reuse)
SUSPEND_TIME, SUSPEND_TIMEOUT, RESUME_TIMEOUT, ORPHAN_GRACE = 6, 5, 30, 20
CLOUD = {"spot": ["el-spot1", "el-spot2"], "od": ["el-od1", "el-od2"]}


def _auth_info() -> str:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=True).stdout
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AuthInfo":
            return value.strip().replace("(null)", "")
    return ""


def _conf(base: Path) -> str:
    bin_dir = base / "bin"
    nodes = [f"NodeName=el-static1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={NODE_PORT} CPUs=1 RealMemory=500 State=UNKNOWN"]
    port = NODE_PORT + 1
    for names in CLOUD.values():
        for n in names:
            nodes.append(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=500 State=CLOUD")
            port += 1
    return f"""ClusterName={NAME}
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo={_auth_info()}
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
SlurmctldParameters=idle_on_node_suspend
SchedulerParameters=batch_sched_delay=0,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
KillWait=5
MinJobAge=300
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ResumeProgram={bin_dir}/gpuhpc-power-resume
SuspendProgram={bin_dir}/gpuhpc-power-suspend
ResumeFailProgram={bin_dir}/gpuhpc-power-resume-fail
SuspendTime={SUSPEND_TIME}
SuspendTimeout={SUSPEND_TIMEOUT}
ResumeTimeout={RESUME_TIMEOUT}
ResumeRate=0
SuspendRate=0
PrivateData=cloud
SuspendExcNodes=el-static1
TreeWidth=65533
{chr(10).join(nodes)}
PartitionName=static Nodes=el-static1 PriorityTier=30 MaxTime=INFINITE State=UP
PartitionName=spot Nodes=el-spot[1-2] PriorityTier=20 MaxTime=INFINITE State=UP
PartitionName=od Nodes=el-od[1-2] PriorityTier=10 MaxTime=INFINITE State=UP
"""


def _elastic_config(base: Path) -> dict:
    groups = [{"name": pool, "nodes": ",".join(names), "provider": "local", "market": "spot" if pool == "spot" else "on_demand",
               "instance_types": [], "max_nodes": 2, "boot_timeout": 20, "capacity_cooldown": 600,
               "price_tier": 1 if pool == "spot" else 2} for pool, names in CLOUD.items()]
    return {"cluster_name": NAME, "power": {"groups": groups, "state_dir": str(base / "elastic"),
                                            "orphan_grace": ORPHAN_GRACE, "resume_timeout": RESUME_TIMEOUT}}


def ports_free() -> list[int]:
    """The ports this cluster needs that something else already listens on."""
    import socket

    busy = []
    for port in (CTLD_PORT, SLURMD_PORT, *range(NODE_PORT, NODE_PORT + 5)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(port)
    return busy


def _wrapper(base: Path, which: str) -> None:
    path = base / "bin" / f"gpuhpc-power-{which}"
    path.write_text(f"""#!/bin/sh
# slurmctld runs this with a bare environment
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF={base}/slurm.conf GPUHPC_ELASTIC_CONFIG={base}/elastic.json PYTHONPATH={REPO}
start=$(date +%s.%N)
{sys.executable} -m gpuhpc power {which} "$@" >> {base}/log/power.log 2>&1
rc=$?
echo "program {which} $* started $start ended $(date +%s.%N) rc $rc" >> {base}/log/power.log
exit $rc
""")
    path.chmod(0o755)


class Elastic:
    """The private cluster, its client, the elastic config and helpers the scenarios share."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.conf = base / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.client = SlurmClient(LocalRunner(env=self.env), timeout=20)
        self.slurm = PowerSlurm(self.client)
        self.config = load_config(base / "elastic.json")
        self.provider = LocalProvider(self.config)
        self.t0 = time.monotonic()
        self.events: list[str] = []

    def mark(self, what: str) -> float:
        t = time.monotonic() - self.t0
        self.events.append(f"{t:6.1f}s {what}")
        print(f"  {t:6.1f}s {what}")
        return t

    def restart_clock(self) -> None:
        self.t0 = time.monotonic()
        self.events = []

    def state(self, node: str) -> str:
        t = time.monotonic()
        nodes = self.slurm.nodes(node)
        self.slowest_command = max(getattr(self, "slowest_command", 0.0), time.monotonic() - t)
        return nodes[0].state if nodes else ""

    def program_durations(self) -> list[tuple[str, float]]:
        """(program and nodes, seconds) of every power program Slurm ran, from the wrappers' log."""
        out = []
        for line in (self.base / "log" / "power.log").read_text().splitlines() if (self.base / "log" / "power.log").exists() else []:
            words = line.split()
            if words[:1] == ["program"] and "started" in words and "ended" in words:
                start, end = float(words[words.index("started") + 1]), float(words[words.index("ended") + 1])
                out.append((" ".join(words[1:words.index("started")]), end - start))
        return out

    def node(self, node: str):
        nodes = self.slurm.nodes(node)
        return nodes[0] if nodes else None

    def faults(self, faults: dict) -> None:
        d = Path(self.config.state_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "local-faults.json").write_text(json.dumps(faults))

    def submit(self, partitions: str, seconds: int = 2, name: str = "gpuhpc-test-elastic") -> str:
        return self.client.submit_script(f"#!/bin/bash\nsleep {seconds}\n", extra=[
            f"--partition={partitions}", f"--job-name={name}", "--output=/dev/null", "--time=5"])

    def job(self, job_id: str) -> dict[str, str]:
        return self.client.show_job(job_id) or {}

    def reconcile(self, now: float | None = None):
        return reconcile_once(self.config, self.slurm, {"local": self.provider}, now=now)


def _stop_pid_file(path: Path) -> None:
    try:
        pid = int(path.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, f"{path.name} to stop")


def start_cluster() -> Elastic:
    """Write the config under a new /var/tmp directory, start slurmctld and the static node's
    slurmd, wait until the cluster answers (the cloud nodes powered down)."""
    busy = ports_free()
    assert not busy, f"ports {busy} of the private elastic cluster are in use (another private cluster?)"
    # short: slurmstepd's socket lives in the spool dir, and a Unix socket path has 108 bytes
    base = Path(tempfile.mkdtemp(prefix="gpuhpc-el-", dir="/var/tmp"))
    for d in ("state", "spool", "log", "run", "bin", "elastic"):
        (base / d).mkdir(parents=True)
    for n in ["el-static1", *(n for names in CLOUD.values() for n in names)]:
        (base / "spool" / n).mkdir()
    (base / "slurm.conf").write_text(_conf(base))
    (base / "elastic.json").write_text(json.dumps(_elastic_config(base)))
    for which in ("resume", "suspend", "resume-fail"):
        _wrapper(base, which)
    env = {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}
    el = Elastic(base)
    try:
        subprocess.run(["slurmctld", "-f", str(el.conf)], env=env, check=True, timeout=60)
        subprocess.run(["slurmd", "-f", str(el.conf), "-N", "el-static1"], env=env, check=True, timeout=60)
        wait_for(lambda: "IDLE" in el.state("el-static1") and "POWERED_DOWN" in el.state("el-spot1"), 60,
                 f"the private elastic cluster to come up (logs: {base}/log)")
    except BaseException:
        stop_cluster(el)
        raise
    return el


def stop_cluster(el: Elastic) -> None:
    """Cancel the private cluster's jobs (by id), stop its daemons and instances, remove its
    directory (kept with GPUHPC_KEEP_ELASTIC_LOGS)."""
    ids = el.client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
    for job_id in ids:
        el.client.run(["scancel", job_id], check=False)
    el.client.run(["scontrol", "shutdown"], check=False)
    _stop_pid_file(el.base / "run" / "slurmctld.pid")
    el.provider.terminate([i.id for i in el.provider.instances()])
    _stop_pid_file(el.base / "run" / "slurmd-el-static1.pid")
    if os.environ.get("GPUHPC_KEEP_ELASTIC_LOGS") is None:
        shutil.rmtree(el.base, ignore_errors=True)
