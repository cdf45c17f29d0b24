"""Helpers for the sweeps integration tests (a uniquely named module)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from cli_helpers import gpuhpc  # noqa: F401  (tests/cli_helpers.py)
from ledger_helpers import research_quota  # noqa: F401  (tests/ledger_helpers.py, shared with jobs)

HERE = Path(__file__).resolve().parent
PY = sys.executable


def write_sweep(path: Path, **fields) -> Path:
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path


def run_sweep(path: Path) -> int:
    res = gpuhpc("sweep", "run", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["sweep_id"]


def results(sid: int) -> list[dict]:
    res = gpuhpc("sweep", "results", str(sid), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def report_cmd(expr: str) -> str:
    """Shell: report ``loss`` = the arithmetic ``expr`` (bash $((...)), over shell variables)."""
    return f"{PY} -m gpuhpc report-metric loss $(( {expr} ))"


def shell_report(expr: str) -> str:
    """Shell: append ``loss`` = ``$(( expr ))`` to the trial's metrics file as the JSON line
    gpuhpc.report writes (less its bookkeeping fields), with no second Python per trial: for
    the long sweeps of many short trials. :func:`report_cmd` (the real command) is what the
    other sweep tests run. (``{{``/``}}``: literal braces in a sweep command.)"""
    return f"""printf '{{{{"metrics": {{{{"loss": %d}}}}}}}}\\n' $(( {expr} )) >> "$GPUHPC_METRICS_FILE\""""


def assert_one_charge_per_run(slurm, db: Path, job_ids: list[str]) -> None:
    """After ``gpuhpc ledger ingest``: one usage record per run of every array task of
    ``job_ids`` (each requeued run counts once) and exactly one charge per usage record."""
    import sqlite3

    res = gpuhpc("ledger", "ingest", "--json")
    assert res.returncode == 0, res.stderr
    runs = [r for r in slurm.accounting(job_ids=job_ids, duplicates=True)
            if r.array_task_id is not None and r.start not in ("", "None", "Unknown")]
    marks = ",".join("?" * len(job_ids))
    con = sqlite3.connect(db)
    try:
        recs = con.execute(f"SELECT job_id, array_task_id, run_start FROM usage_records WHERE job_id IN ({marks})",
                           job_ids).fetchall()
        per_run = con.execute(f"SELECT count(*) FROM charges c JOIN usage_records u ON u.id = c.usage_id "
                              f"WHERE u.job_id IN ({marks}) GROUP BY c.usage_id", job_ids).fetchall()
    finally:
        con.close()
    assert len(recs) == len(set(recs)) == len(runs), (len(recs), len(set(recs)), len(runs))
    assert len(per_run) == len(recs) and {n for (n,) in per_run} == {1}, (len(per_run), len(recs))


def restart_slurmctld(timeout: float = 60) -> int:
    """Restart the local cluster's slurmctld the way its pid-file service runs it
    (ansible/local/roles/gpuhpc_test_pidfile_service): SIGTERM the pid in
    SlurmctldPidFile, wait for it to exit, start the same command line with the same environment
    (SLURM_CONF) and working directory, and wait until ``scontrol ping`` answers. Its state
    (StateSaveLocation) carries the jobs over. Returns the new pid."""
    from polling import wait_for

    cfg = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    pid_file = next(line.split("=", 1)[1].strip() for line in cfg.splitlines()
                    if line.startswith("SlurmctldPidFile"))
    pid = int(Path(pid_file).read_text().split()[0])
    proc = Path(f"/proc/{pid}")
    assert (proc / "comm").read_text().strip() == "slurmctld", pid
    argv = [a for a in (proc / "cmdline").read_bytes().decode().split("\0") if a]
    env = dict(kv.split("=", 1) for kv in (proc / "environ").read_bytes().decode().split("\0") if "=" in kv)
    cwd = os.readlink(proc / "cwd")
    os.kill(pid, 15)
    wait_for(lambda: not proc.exists(), timeout, f"slurmctld {pid} to exit after SIGTERM", interval=0.1)
    subprocess.run(argv, env=env, cwd=cwd, check=True)      # it daemonizes and writes its pid file

    def up() -> bool:
        res = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
        return res.returncode == 0 and "is UP" in res.stdout

    wait_for(up, timeout, "slurmctld to answer scontrol ping after its restart", interval=0.2)
    return int(Path(pid_file).read_text().split()[0])


def private_cluster_fixtures(name: str, ports: tuple[int, int, int], gpu: bool = False):
    """A module's ``private_cluster`` and ``slurm`` fixtures (private_slurm.module_fixtures) on a
    private controller shaped as the local cluster for sweeps: partition ``cpu`` (one 16-CPU node,
    where drivers run) and ``all`` (that node and two more), the shared cluster's MaxArraySize,
    under its own cluster name in the shared slurmdbd (``sacct`` works). In the module::

        private_cluster, slurm = private_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT))

    ``gpu=True``: the two other nodes are GPU nodes as the local cluster's gpu-node1/2, in its
    partitions ``gpu`` and ``gpu-hi`` with its preemption (private_slurm.gpu_shape); their names
    are ``cluster.gpu_nodes``."""
    from private_slurm import PrivateSlurm, gpu_shape, module_fixtures

    def make():
        prefix = name.removeprefix("gpuhpc")[:6]
        nodes = [f"{prefix}-node1", f"{prefix}-node2", f"{prefix}-cpu1"]
        attrs = {n: "CPUs=16 RealMemory=32000 State=UNKNOWN" for n in nodes}
        partitions = [f"PartitionName=cpu Nodes={nodes[2]} MaxTime=INFINITE State=UP",
                      "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP"]
        extra = {"SlurmdParameters": "config_overrides", "MaxArraySize": "51", "MinJobAge": "600", "JobRequeue": "1",
                 "KillWait": "5", "SchedulerParameters": "batch_sched_delay=0,sched_interval=2,bf_interval=5"}
        start: dict = {}
        if gpu:
            shape = gpu_shape(nodes[:2], accounting=True)
            attrs.update(shape["nodes"])
            partitions += shape["partitions"]
            extra.update(shape["extra"])
            start["before_start"] = shape["before_start"]
        cluster = PrivateSlurm(name, ports, attrs, partitions, extra=extra, accounting=True)
        cluster.gpu_nodes = nodes[:2] if gpu else []
        return cluster, start

    return module_fixtures(make)
