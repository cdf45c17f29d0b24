"""The private elastic cluster (elastic_helpers.py) as a package-scoped fixture, and a per-test
fixture that returns every cloud node to powered-down idle with no fault, cooldown or record."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from elastic_helpers import CLOUD, Elastic, _conf, _elastic_config, _wrapper, ports_free
from polling import wait_for


def _stop_pid_file(path: Path) -> None:
    try:
        pid = int(path.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, f"{path.name} to stop")


@pytest.fixture(scope="package")
def elastic_cluster():
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
        yield el
    finally:
        ids = el.client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        for job_id in ids:                       # the private cluster's own jobs, by id
            el.client.run(["scancel", job_id], check=False)
        el.client.run(["scontrol", "shutdown"], check=False)
        _stop_pid_file(base / "run" / "slurmctld.pid")
        el.provider.terminate([i.id for i in el.provider.instances()])
        _stop_pid_file(base / "run" / "slurmd-el-static1.pid")
        if os.environ.get("GPUHPC_KEEP_ELASTIC_LOGS") is None:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def elastic(elastic_cluster):
    """The cluster with every cloud node powered down and no fault, cooldown or record left."""
    el = elastic_cluster
    el.faults({})
    cloud = ",".join(n for names in CLOUD.values() for n in names)
    el.reconcile(now=time.time() + 10**6)          # ends any cooldown, forgets stale records

    seen: dict[str, str] = {}

    def settled() -> bool:
        nodes = el.slurm.nodes(cloud)
        seen.update({n.name: n.state for n in nodes})
        down = [n.name for n in nodes if "DOWN" in n.flags]
        up = [n.name for n in nodes if not n.flags & {"POWERED_DOWN", "POWERING_DOWN", "DOWN"}]
        if down:
            el.slurm.resume(",".join(down))
        if up:
            el.slurm.power_down(",".join(up))
        return len(nodes) == 4 and all(n.flags >= {"IDLE", "POWERED_DOWN"} and "DOWN" not in n.flags for n in nodes)
    wait_for(settled, 60, f"every cloud node powered down and idle (last seen: {seen})")
    el.restart_clock()
    yield el
    ids = el.client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
    for job_id in ids:
        el.client.run(["scancel", job_id], check=False)
    print("\n".join(["node/job sequence:"] + el.events))
    runs = el.program_durations()
    if runs:
        worst = max(runs, key=lambda r: r[1])
        print(f"power programs so far: {len(runs)}, slowest {worst[1]:.2f}s ({worst[0]}); "
              f"slowest scontrol show node while polling: {getattr(el, 'slowest_command', 0.0):.2f}s")
