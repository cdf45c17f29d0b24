"""A private Slurm controller for tests: the one builder (COMMON rule: do not write another).

Its own slurmctld and one ``slurmd -N NAME`` per node, each on its own port, with state, spool,
pid files and logs under one new directory in /var/tmp (short: slurmstepd's socket lives in the
spool dir and a Unix socket path has 108 bytes); the shared munged (``AuthInfo`` copied from the
shared cluster's slurm.conf), no accounting unless asked. It never touches the shared cluster, so a
test built on it is marked ``isolated`` (it runs beside the shared-cluster stream).

API::

    from private_slurm import PrivateSlurm

    cluster = PrivateSlurm(
        "gpuhpcx",                      # ClusterName; also the directory prefix gpuhpc-x-...
        ports=(16990, 16991, 17390),    # SlurmctldPort, SlurmdPort, first node port (node i: +i)
        nodes={"x-node1": "CPUs=1 RealMemory=500 State=UNKNOWN"},   # name -> the rest of its line
                                        # (NodeHostname=localhost NodeAddr=127.0.0.1 unless it sets NodeAddr)
        partitions=["PartitionName=x Nodes=x-node1 Default=YES MaxTime=INFINITE State=UP"],
        extra={"PreemptType": "preempt/qos", "TaskPlugin": None},   # add/override; None drops a key;
                                        # "{base}" in a value is the cluster's directory
        accounting=False,               # True: the shared slurmdbd (AccountingStorageHost/Port)
        start=None,                     # nodes whose slurmd starts (default: every non-CLOUD node)
        extra_dirs=("elastic",),        # more directories made under .base
        on_stop=None,                   # called with .base once the daemons are stopped, before removal
        slurmd_prefix=None,             # node -> argv put before that node's slurmd (e.g. unshare: a
                                        # mount namespace of its own); None: slurmd alone
    )
    with cluster:                       # start(); stop() on exit, even after a failure
        cluster.client                  # SlurmClient on the private cluster (timeout 20 s)
        cluster.env                     # os.environ + SLURM_CONF: for subprocess / gpuhpc
        cluster.slurm_env               # {"SLURM_CONF": ...}
        cluster.base, cluster.conf      # the directory and its slurm.conf
        cluster.node_port("x-node1")
        cluster.start_slurmd("x-node1"); cluster.stop_slurmd("x-node1")
        cluster.logs()                  # the logs' last lines, for a failure message

``start(ready=...)`` writes the config (``before_start(base)`` may add files first, e.g. power
programs), refuses when one of its ports is taken (pick free ones: grep the tree for the ports in
use; each test file has its own; ``GPUHPC_PRIVATE_SLURM_PORT_OFFSET=N`` moves them all by N to run a
second copy beside a running one), starts the daemons and waits until every started node is idle
(or ``ready()`` is true). ``stop()`` cancels the cluster's own jobs by id, shuts the controller
down, stops every slurmd it started (pid files), and removes the directory (kept when
``GPUHPC_KEEP_PRIVATE_SLURM`` is set: the logs are then under ``base/log``).

``gpu_shape(["x-node1", "x-node2"], accounting=False)``: the local cluster's GPU nodes (8 ``h100`` GRES each) and its
``gpu``/``gpu-hi`` partitions and preemption, as ``nodes``, ``partitions``, ``extra`` and the
``before_start`` that writes gres.conf and the devices.

An ``accounting=True`` cluster whose test reads ``sacct`` runs inside ``with cluster.in_slurmdbd():``
(instead of ``with cluster:``): its cluster name is added to the shared slurmdbd before it starts
(FirstJobId past that name's earlier records unless ``extra`` sets one), and at the end its jobs are
ended and closed in slurmdbd, the cluster stopped and its name removed again, even after a failure.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner
from polling import wait_for


def shared_conf_values() -> dict[str, str]:
    """``Key=value`` lines of the shared cluster's slurm.conf (``$SLURM_CONF``, else
    /etc/slurm/slurm.conf), read from the file: a private cluster starts even while the shared
    slurmctld is restarting."""
    path = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.split("#", 1)[0].strip().partition("=")
        if sep and " " not in key and key not in ("NodeName", "PartitionName", "NodeSet"):
            values[key] = value.strip()
    return values


def first_free_job_id(cluster: str) -> int:
    """One past the highest job id slurmdbd holds for ``cluster`` (1 when none): opt-in
    ``extra={"FirstJobId": ...}`` for an ``accounting=True`` cluster whose test asks sacct by job
    id. ``sacctmgr delete cluster`` keeps the cluster's job records, so a cluster of the same name
    made again (every run of the test) would otherwise count from 1 and sacct would also return
    the earlier runs' jobs of the same ids. Asks the shared slurm.conf's slurmdbd."""
    res = subprocess.run(["sacct", "-M", cluster, "--allusers", "-X", "-n", "-P", "-o", "JobIDRaw",
                          "-S", "2000-01-01", "-E", "now"], capture_output=True, text=True, timeout=60)
    ids = [int(x) for x in res.stdout.split() if x.isdigit()] if res.returncode == 0 else []
    return max(ids, default=0) + 1


def busy_ports(ports: Iterable[int]) -> list[int]:
    """The ports of ``ports`` that something already listens on."""
    busy = []
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(port)
    return busy


def _gone(pid: int) -> bool:
    """No such process, or a zombie (an unreaped child of this test is gone too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z"
    except (OSError, IndexError):
        return True


def _stop_pid(path: Path, timeout: float = 30) -> None:
    try:
        pid = int(path.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    wait_for(lambda: _gone(pid), timeout, f"{path.name} ({pid}) to stop", interval=0.1)


class PrivateSlurm:
    """A private controller and its nodes (see the module docstring)."""

    def __init__(self, name: str, ports: tuple[int, int, int], nodes: dict[str, str], partitions: list[str],
                 extra: dict[str, str | None] | None = None, accounting: bool = False,
                 start: list[str] | None = None, extra_dirs: Iterable[str] = (), timeout: float = 20,
                 on_stop: Callable[[Path], None] | None = None,
                 slurmd_prefix: Callable[[str], list[str]] | None = None) -> None:
        self.name = name
        # a second copy of the same tests beside a running one (a developer's run beside CI's)
        offset = int(os.environ.get("GPUHPC_PRIVATE_SLURM_PORT_OFFSET") or 0)
        self.ctld_port, self.slurmd_port, self.first_node_port = (p + offset for p in ports)
        self.nodes = dict(nodes)
        self.partitions = list(partitions)
        self.extra = dict(extra or {})
        self.accounting = accounting
        self.start_nodes = start if start is not None else [n for n, a in nodes.items() if "State=CLOUD" not in a]
        self.extra_dirs = tuple(extra_dirs)
        self.timeout = timeout
        self.on_stop = on_stop
        self.slurmd_prefix = slurmd_prefix
        self.base: Path | None = None
        self.conf: Path | None = None
        self.env: dict[str, str] = {}
        self.slurm_env: dict[str, str] = {}
        self.client: SlurmClient | None = None

    # --- configuration -------------------------------------------------------------------
    def ports(self) -> list[int]:
        return [self.ctld_port, self.slurmd_port, *(self.node_port(n) for n in self.nodes)]

    def node_port(self, node: str) -> int:
        return self.first_node_port + list(self.nodes).index(node)

    def settings(self, base: Path) -> dict[str, str]:
        """The slurm.conf keys (before ``extra``)."""
        shared = shared_conf_values()
        out = {
            "ClusterName": self.name, "SlurmctldHost": "localhost", "SlurmUser": "root", "SlurmdUser": "root",
            "SlurmctldPort": str(self.ctld_port), "SlurmdPort": str(self.slurmd_port),
            "AuthType": "auth/munge", "CredType": "cred/munge", "AuthInfo": shared.get("AuthInfo", ""),
            "StateSaveLocation": f"{base}/state", "SlurmdSpoolDir": f"{base}/spool/%n",
            "SlurmctldPidFile": f"{base}/run/slurmctld.pid", "SlurmdPidFile": f"{base}/run/slurmd-%n.pid",
            "SlurmctldLogFile": f"{base}/log/slurmctld.log", "SlurmdLogFile": f"{base}/log/slurmd-%n.log",
            "MailProg": "/bin/true", "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "ReturnToService": "2", "SchedulerParameters": "batch_sched_delay=0,sched_interval=2",
            "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core",
            "AccountingStorageType": "accounting_storage/none", "JobAcctGatherType": "jobacct_gather/none",
        }
        if self.accounting:
            out["AccountingStorageType"] = "accounting_storage/slurmdbd"
            out["AccountingStorageHost"] = shared.get("AccountingStorageHost", "localhost")
            out["AccountingStoragePort"] = shared.get("AccountingStoragePort", "6819")
        return out

    def render(self, base: Path) -> str:
        settings = self.settings(base)
        for key, value in self.extra.items():
            if value is None:
                settings.pop(key, None)
            else:
                settings[key] = value.replace("{base}", str(base))
        lines = [f"{k}={v}" for k, v in settings.items()]
        lines += [f"NodeName={n} {'' if 'NodeAddr=' in attrs else 'NodeHostname=localhost NodeAddr=127.0.0.1 '}"
                  f"Port={self.node_port(n)} {attrs}".rstrip() for n, attrs in self.nodes.items()]
        return "\n".join(lines + self.partitions) + "\n"

    # --- life cycle ----------------------------------------------------------------------
    def start(self, ready: Callable[[], object] | None = None, before_start: Callable[[Path], None] | None = None,
              timeout: float = 60) -> PrivateSlurm:
        busy = busy_ports(self.ports())
        assert not busy, f"ports {busy} of the private cluster {self.name} are in use (another private cluster?)"
        prefix = self.name.removeprefix("gpuhpc")[:6] or "slurm"
        self.base = base = Path(tempfile.mkdtemp(prefix=f"gpuhpc-{prefix}-", dir="/var/tmp"))
        for d in ("state", "spool", "log", "run", *self.extra_dirs):
            (base / d).mkdir(parents=True, exist_ok=True)
        for n in self.nodes:
            (base / "spool" / n).mkdir()
        self.conf = base / "slurm.conf"
        self.conf.write_text(self.render(base))
        self.slurm_env = {"SLURM_CONF": str(self.conf)}
        self.env = {**os.environ, **self.slurm_env}
        self.client = SlurmClient(LocalRunner(env=self.slurm_env), timeout=self.timeout)
        try:
            if before_start:
                before_start(base)
            subprocess.run(["slurmctld", "-f", str(self.conf)], env=self.env, check=True, timeout=60)
            for n in self.start_nodes:
                self.start_slurmd(n)
            wait_for(ready or self._started_nodes_idle, timeout,
                     f"the private cluster {self.name} to come up (logs: {base}/log)", interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def _started_nodes_idle(self) -> bool:
        if not self.start_nodes:
            return self.client.run(["scontrol", "ping"], check=False).returncode == 0
        out = self.client.run(["sinfo", "-h", "-N", "-o", "%N %t", "-n", ",".join(self.start_nodes)],
                              check=False).stdout.split("\n")
        idle = {line.split()[0] for line in out if line.strip() and line.split()[1].startswith("idle")}
        return idle >= set(self.start_nodes)

    def start_slurmd(self, node: str, *args: str) -> None:
        prefix = self.slurmd_prefix(node) if self.slurmd_prefix else []
        subprocess.run([*prefix, "slurmd", "-f", str(self.conf), "-N", node, *args], env=self.env, check=True,
                       timeout=60)

    def stop_slurmd(self, node: str) -> None:
        _stop_pid(self.base / "run" / f"slurmd-{node}.pid")

    def job_ids(self) -> list[str]:
        return self.client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()

    def cancel_all(self, wait: float = 0) -> None:
        """Cancel the private cluster's own jobs, by id; wait up to ``wait`` s for them to end."""
        ids = self.job_ids()
        for job_id in ids:
            self.client.run(["scancel", job_id], check=False)
        if ids and wait:
            wait_for(lambda: not self.job_ids(), wait, f"the private cluster {self.name}'s jobs to end")

    def stop(self) -> None:
        if self.base is None:
            return
        if self.client is not None:
            self.cancel_all()
            self.client.run(["scontrol", "shutdown"], check=False)
        _stop_pid(self.base / "run" / "slurmctld.pid")
        for pid_file in sorted((self.base / "run").glob("slurmd-*.pid")):
            _stop_pid(pid_file)
        if self.on_stop is not None:
            self.on_stop(self.base)
        if os.environ.get("GPUHPC_KEEP_PRIVATE_SLURM") is None:
            shutil.rmtree(self.base, ignore_errors=True)

    def logs(self, lines: int = 15) -> str:
        """The private cluster's logs' last lines, for a failure's message."""
        if self.base is None:
            return ""
        return "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
                         for f in sorted((self.base / "log").glob("*.log")))

    @contextlib.contextmanager
    def in_slurmdbd(self, **start_kwargs) -> Iterator[PrivateSlurm]:
        """Start (``start(**start_kwargs)``) this ``accounting=True`` cluster under its own name in the
        shared slurmdbd and yield it; at the end cancel its jobs, wait (up to 60 s) for slurmdbd to hear
        of their ends, close what it still counts as running (``runawayjobs``: they would keep the name
        from being deleted), stop the cluster and delete its name, even after a failure. An
        interrupted run's leftovers are removed first, so the next run can add the name again."""
        assert self.accounting, f"{self.name}: in_slurmdbd() is for an accounting=True cluster"
        # sacctmgr for the cluster name itself: the shared slurm.conf (the private one is gone after stop)
        shared = SlurmClient(LocalRunner(env={"SLURM_CONF": os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"}))
        self.extra.setdefault("FirstJobId", str(first_free_job_id(self.name)))   # past the earlier runs' records

        def forget() -> None:
            shared.sacctmgr("delete", "cluster", self.name, check=False)

        def runaways() -> None:
            self.client.run(["sacctmgr", "-i", "list", "runawayjobs", f"cluster={self.name}"], check=False)

        def unfinished() -> list[str]:
            out = self.client.run(["sacct", "-M", self.name, "--allusers", "-X", "-n", "-P", "-o", "JobIDRaw,State",
                                   "-S", "2000-01-01", "-E", "now"], check=False).stdout
            return [line for line in out.splitlines() if line.split("|")[-1] in ("PENDING", "RUNNING", "REQUEUED")]

        forget()                                                 # leftovers of an interrupted run
        try:
            shared.sacctmgr("add", "cluster", self.name, check=False)   # still there when its jobs kept it
            self.start(**start_kwargs)
            try:
                runaways()
                yield self
            finally:
                self.cancel_all(wait=60)
                deadline = time.monotonic() + 60               # slurmdbd hears of the ends a little later
                while unfinished() and time.monotonic() < deadline:
                    time.sleep(1)
                runaways()
                self.stop()
        finally:
            forget()

    def __enter__(self) -> PrivateSlurm:
        if self.base is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def module_fixtures(make: Callable[[], tuple[PrivateSlurm, dict]]):
    """A test module's two fixtures on one private controller: ``private_cluster`` (module-scoped:
    ``make()`` returns the cluster and its ``start`` keyword arguments; started, in the shared
    slurmdbd when it is an ``accounting=True`` one (:meth:`PrivateSlurm.in_slurmdbd`), with
    SLURM_CONF pointing gpuhpc, the jobs and every Slurm call of the module at it; stopped at the
    end) and ``slurm`` (its SlurmClient, in place of the shared cluster's). In the module::

        private_cluster, slurm = module_fixtures(lambda: (PrivateSlurm(...), {}))
    """
    import pytest

    @pytest.fixture(scope="module")
    def private_cluster():
        cluster, start = make()
        if cluster.accounting:
            life = cluster.in_slurmdbd(**start)
        else:
            cluster.start(**start)
            life = cluster                      # `with cluster:` stops it
        with life, pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", str(cluster.conf))
            yield cluster

    @pytest.fixture
    def slurm(private_cluster):
        return private_cluster.client

    return private_cluster, slurm


def gpu_shape(gpu_nodes: list[str], accounting: bool = False) -> dict:
    """The local cluster's GPU nodes and partitions for a :class:`PrivateSlurm`: ``gpu_nodes`` as its
    gpu-node1/2 (16 CPUs, 8 ``h100`` GRES each: character devices of NVIDIA's major under the
    cluster's directory, as the local cluster's fake GPUs), partitions ``gpu`` (PriorityTier 1,
    requeued on preemption after GraceTime 30) and ``gpu-hi`` (PriorityTier 10) with its per-GPU CPU
    and memory defaults, and its preemption (partition_prio, REQUEUE, preempt_send_user_signal).
    Returns ``nodes`` (name -> line), ``partitions``, ``extra`` (to merge into the cluster's) and
    ``before_start`` (writes gres.conf and the devices: pass it to ``start``/``in_slurmdbd``).
    ``accounting``: for an ``accounting=True`` cluster, the GPUs are TRES too (AccountingStorageTRES:
    in nodes' AllocTRES, sacct's AllocTRES, the ledger's charges; slurmctld refuses it without slurmdbd)."""
    import stat

    names = ",".join(gpu_nodes)
    per_gpu = "DefCpuPerGPU=2 DefMemPerGPU=8000 MaxTime=INFINITE State=UP"

    def before_start(base: Path) -> None:
        (base / "dev").mkdir(exist_ok=True)
        for n in gpu_nodes:
            for i in range(8):
                os.mknod(base / "dev" / f"{n}-nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(195, i))
        (base / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName={n} Name=gpu Type=h100 File={base}/dev/{n}-nvidia[0-7]\n" for n in gpu_nodes))

    return {
        "nodes": {n: "CPUs=16 RealMemory=64000 Gres=gpu:h100:8 State=UNKNOWN" for n in gpu_nodes},
        "partitions": [f"PartitionName=gpu Nodes={names} PriorityTier=1 PreemptMode=REQUEUE GraceTime=30 {per_gpu}",
                       f"PartitionName=gpu-hi Nodes={names} PriorityTier=10 PreemptMode=OFF {per_gpu}"],
        "extra": {"GresTypes": "gpu", "PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE",
                  "SlurmctldParameters": "preempt_send_user_signal",
                  **({"AccountingStorageTRES": "gres/gpu,gres/gpu:h100"} if accounting else {})},
        "before_start": before_start,
    }
