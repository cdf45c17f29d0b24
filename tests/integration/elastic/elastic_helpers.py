"""Helpers for the elastic scenarios (conftest.py starts the cluster): a private Slurm controller
(tests/private_slurm.py) with cloud nodes for the elastic scenarios (docs/elastic.md).

Its own slurmctld (own ports, state and logs under a directory in /var/tmp, the shared munged; no
accounting), so powering nodes up and down never touches the shared cluster. One static node runs from the start; four ``State=CLOUD`` nodes in two
price tiers (``spot``: el-spot[1-2], PriorityTier 20; ``od``: el-od[1-2], PriorityTier 10) are
powered up by ``gpuhpc power resume`` with the local provider (``slurmd -D -b -N NAME``) and down
after SuspendTime. Timeouts are short: SuspendTime 6 s, ResumeTimeout 30 s (a slurmd start on a
loaded CI machine has taken 16 s)."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from gpuhpc.elastic.config import load_config
from gpuhpc.elastic.providers.local import LocalProvider
from gpuhpc.elastic.reconcile import reconcile_once
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.parsers import parse_oneliner_records
from gpuhpc.slurm.power import PowerSlurm, show_nodes
from gpuhpc.transport.local import LocalRunner
from private_slurm import PrivateSlurm

REPO = Path(__file__).resolve().parents[3]
NAME = "gpuhpcel"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16957, 16958, 17361    # unlike every other private cluster's (grep before reuse)
SUSPEND_TIME, SUSPEND_TIMEOUT, RESUME_TIMEOUT, ORPHAN_GRACE = 6, 5, 30, 20
RESTART_BUDGET = 1            # a job is requeued after one reclaim; the second holds it
# protect_after 1: the pool that never boots (its one scenario) is protected at its first failure
CLOUD = {"spot": ["el-spot1", "el-spot2"], "od": ["el-od1", "el-od2"], "dns": ["el-dns1"]}
UNRESOLVED = "el-dns1"        # no NodeAddr in slurm.conf and a name no resolver knows (the provider sets NodeAddr)


EXTRA = {
    "SlurmdParameters": "config_overrides", "SlurmctldParameters": "idle_on_node_suspend",
    "JobRequeue": "1", "KillWait": "5", "MinJobAge": "300",
    "SuspendTime": str(SUSPEND_TIME), "SuspendTimeout": str(SUSPEND_TIMEOUT), "ResumeTimeout": str(RESUME_TIMEOUT),
    "ResumeRate": "0", "SuspendRate": "0", "PrivateData": "cloud", "SuspendExcNodes": "el-static1",
    "TreeWidth": "65533", "ResumeProgram": "{base}/bin/gpuhpc-power-resume",
    "SuspendProgram": "{base}/bin/gpuhpc-power-suspend", "ResumeFailProgram": "{base}/bin/gpuhpc-power-resume-fail",
}


def _private_slurm() -> PrivateSlurm:
    nodes = {"el-static1": "CPUs=1 RealMemory=500 State=UNKNOWN"}
    nodes.update({n: "CPUs=1 RealMemory=500 State=CLOUD" for names in CLOUD.values() for n in names})
    nodes[UNRESOLVED] = f"NodeAddr={UNRESOLVED} NodeHostname={UNRESOLVED} " + nodes[UNRESOLVED]
    partitions = ["PartitionName=static Nodes=el-static1 PriorityTier=30 MaxTime=INFINITE State=UP",
                  "PartitionName=spot Nodes=el-spot[1-2] PriorityTier=20 MaxTime=INFINITE State=UP",
                  "PartitionName=od Nodes=el-od[1-2] PriorityTier=10 MaxTime=INFINITE State=UP",
                  f"PartitionName=dns Nodes={UNRESOLVED} MaxTime=INFINITE State=UP"]
    return PrivateSlurm(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), nodes, partitions, extra=dict(EXTRA),
                        extra_dirs=("bin", "elastic"))


def _elastic_config(base: Path) -> dict:
    groups = [{"name": pool, "nodes": ",".join(names), "provider": "local", "market": "spot" if pool == "spot" else "on_demand",
               "instance_types": [], "max_nodes": 2, "boot_timeout": 20, "capacity_cooldown": 600,
               "price_tier": 1 if pool == "spot" else 2, "restart_budget": RESTART_BUDGET}
              for pool, names in CLOUD.items()]
    return {"cluster_name": NAME, "power": {"groups": groups, "state_dir": str(base / "elastic"), "protect_after": 1,
                                            "orphan_grace": ORPHAN_GRACE, "resume_timeout": RESUME_TIMEOUT}}


def _wrapper(base: Path, which: str) -> None:
    path = base / "bin" / f"gpuhpc-power-{which}"
    path.write_text(f"""#!/bin/sh
# slurmctld runs this with a bare environment
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF={base}/slurm.conf GPUHPC_ELASTIC_CONFIG={base}/elastic.json PYTHONPATH={REPO}
start=$(date +%s.%N)
# what Slurm gave the program: the job map (SLURM_RESUME_FILE), one line per call
if [ -n "${{SLURM_RESUME_FILE:-}}" ]; then {{ cat "$SLURM_RESUME_FILE"; echo; }} >> {base}/log/resume-files.log 2>&1; fi
{sys.executable} -m gpuhpc power {which} "$@" >> {base}/log/power.log 2>&1
rc=$?
echo "program {which} $* started $start ended $(date +%s.%N) rc $rc" >> {base}/log/power.log
exit $rc
""")
    path.chmod(0o755)


SLOW = 2.0        # acceptance 7: no Slurm command slower than this during any scenario


class TimedRunner(LocalRunner):
    """A LocalRunner that keeps the slowest duration of each Slurm command it ran."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env=env)
        self.slowest: dict[str, float] = {}
        self.lock = threading.Lock()

    def run(self, argv, **kw):
        t = time.monotonic()
        try:
            return super().run(argv, **kw)
        finally:
            key = " ".join(argv[:2]) if argv[0] == "scontrol" else argv[0]
            with self.lock:
                self.slowest[key] = max(self.slowest.get(key, 0.0), time.monotonic() - t)


class Prober:
    """A thread that runs squeue, sinfo and scontrol ping in turn (0.5 s apart) while a scenario
    runs, as users and their tools do: a blocked power-save thread or an unresolvable node name
    would show here as a slow command."""

    def __init__(self, client: SlurmClient) -> None:
        self.client = client
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        argvs = (["squeue", "-h"], ["sinfo", "-h"], ["scontrol", "ping"])
        i = 0
        while not self.stop_event.wait(0.5):
            self.client.run(argvs[i % 3], check=False)
            i += 1

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(30)


class Elastic:
    """The private cluster, its client, the elastic config and helpers the scenarios share."""

    def __init__(self, cluster: PrivateSlurm) -> None:
        self.cluster = cluster
        self.base = base = cluster.base
        self.conf = cluster.conf
        self.env = cluster.slurm_env
        self.runner = TimedRunner(self.env)
        self.client = SlurmClient(self.runner, timeout=20)
        self.slurm = PowerSlurm(self.client)
        self.config = load_config(base / "elastic.json")
        self.provider = LocalProvider(self.config)
        self.t0 = time.monotonic()
        self.events: list[str] = []
        auth = next((line[len("AuthInfo="):] for line in self.conf.read_text().splitlines() if line.startswith("AuthInfo=")), "")
        self.cred_expire = int(dict(kv.partition("=")[::2] for kv in auth.split(",")).get("cred_expire") or 120)

    def mark(self, what: str) -> float:
        t = time.monotonic() - self.t0
        self.events.append(f"{t:6.1f}s {what}")
        print(f"  {t:6.1f}s {what}")
        return t

    def restart_clock(self) -> None:
        self.t0 = time.monotonic()
        self.events = []

    def state(self, node: str) -> str:
        nodes = self.slurm.nodes(node)
        return nodes[0].state if nodes else ""

    def node_addr(self, node: str) -> str:
        recs = parse_oneliner_records(self.client.run(show_nodes(node), check=False).stdout)
        return recs[0].get("NodeAddr", "") if recs else ""

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


def start_cluster() -> Elastic:
    """Write the config under a new /var/tmp directory, start slurmctld and the static node's
    slurmd, wait until the cluster answers (the cloud nodes powered down)."""
    return _start(_private_slurm(), _elastic_config, "el-static1", "el-spot1")


# the chaos run's own cluster (test_elastic_chaos.py): spot nodes of 4 CPUs, one static node
CHAOS_NAME, CHAOS_PORTS = "gpuhpcch", (16967, 16968, 17371)       # unlike every other private cluster's
CHAOS_SPOT, CHAOS_CPUS = [f"ch-spot{i}" for i in range(1, 6)], 4
CHAOS_PRICE, CHAOS_OD_PRICE, CHAOS_ORPHAN_GRACE = "1.10", "3.90", 20


def start_chaos_cluster(duration: float) -> Elastic:
    """Five powered-down spot nodes (4 CPUs each: 20 single-CPU jobs at once) and a static
    controller-side node; every job may be requeued any number of times (restart budget 1000)."""
    nodes = {"ch-static1": "CPUs=1 RealMemory=500 State=UNKNOWN"}
    nodes.update({n: f"CPUs={CHAOS_CPUS} RealMemory=2000 State=CLOUD" for n in CHAOS_SPOT})
    extra = {**EXTRA, "SuspendExcNodes": "ch-static1", "MaxJobCount": "1000"}
    if duration > 240:
        # a job that completed early in the 600 s run must still be known when the run ends (the
        # CI's 150 s run keeps the default 300 s, with which its nodes were seen to power down)
        extra["MinJobAge"] = "3600"
    cluster = PrivateSlurm(CHAOS_NAME, CHAOS_PORTS, nodes, [
        "PartitionName=static Nodes=ch-static1 MaxTime=INFINITE State=UP",
        f"PartitionName=spot Nodes={','.join(CHAOS_SPOT)} MaxTime=INFINITE State=UP"], extra=extra,
        extra_dirs=("bin", "elastic"))

    def config(base: Path) -> dict:
        return {"cluster_name": CHAOS_NAME, "power": {
            "groups": [{"name": "spot", "nodes": ",".join(CHAOS_SPOT), "provider": "local", "market": "spot",
                        "instance_types": ["local"], "max_nodes": len(CHAOS_SPOT), "boot_timeout": 20,
                        "capacity_cooldown": 60, "price_tier": 1, "restart_budget": 1000,
                        "hourly_price": CHAOS_PRICE, "on_demand_hourly_price": CHAOS_OD_PRICE}],
            "state_dir": str(base / "elastic"), "orphan_grace": CHAOS_ORPHAN_GRACE, "resume_timeout": RESUME_TIMEOUT}}
    return _start(cluster, config, "ch-static1", CHAOS_SPOT[0])


def _start(cluster: PrivateSlurm, config, static: str, cloud: str) -> Elastic:
    def programs(base: Path) -> None:
        for which in ("resume", "suspend", "resume-fail"):
            _wrapper(base, which)
        (base / "elastic.json").write_text(json.dumps(config(base)))

    def ready() -> bool:
        nodes = {n.name: n.state for n in PowerSlurm(cluster.client).nodes(f"{static},{cloud}")}
        return "IDLE" in nodes.get(static, "") and "POWERED_DOWN" in nodes.get(cloud, "")

    def end_instances(base: Path) -> None:
        provider = LocalProvider(load_config(base / "elastic.json"))
        provider.terminate([i.id for i in provider.instances()])

    cluster.on_stop = end_instances
    cluster.start(ready=ready, before_start=programs)
    return Elastic(cluster)


def stop_cluster(el: Elastic) -> None:
    """Cancel the private cluster's jobs (by id), stop its daemons and instances, remove its
    directory (kept with GPUHPC_KEEP_PRIVATE_SLURM)."""
    el.cluster.stop()
