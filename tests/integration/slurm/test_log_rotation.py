"""Log rotation on the local cluster (issue 36.7): the collection's logrotate file rotates the
daemons' logs for real, and slurmctld and slurmd reopen theirs (SIGUSR2), so what they log after a
rotation lands in the new file, not in the renamed one (a daemon that kept writing to its old
descriptor would fill slurmctld.log.1 forever, and the disk with it)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for

pytestmark = pytest.mark.integration

CONF = Path("/etc/logrotate.d/gpuhpc-slurm")


@pytest.fixture(scope="module")
def client() -> SlurmClient:
    return SlurmClient()


def test_a_rotation_renames_the_logs_and_the_daemons_write_to_the_new_ones(client, tmp_path):
    assert CONF.is_file(), "gpuhpc_slurm_common writes it (gpuhpc_slurm_common_logrotate)"
    log_dir = Path(client.config()["SlurmctldLogFile"]).parent
    assert f"{log_dir}/slurmctld.log " in CONF.read_text(), \
        f"{CONF} is not the local cluster's (a role test converged into this machine's /etc?)"
    dry = subprocess.run(["logrotate", "-d", "-s", str(tmp_path / "dry.state"), str(CONF)],
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "error" not in dry.stderr.lower(), dry.stderr
    ctld, slurmd = log_dir / "slurmctld.log", log_dir / "slurmd-gpu-node1.log"
    before = {p: os.stat(p).st_ino for p in (ctld, slurmd)}
    rot = subprocess.run(["logrotate", "-f", "-s", str(tmp_path / "state"), str(CONF)],
                         capture_output=True, text=True, timeout=60)
    assert rot.returncode == 0, rot.stderr
    for p, inode in before.items():
        old = p.with_name(p.name + ".1")
        assert old.exists() and os.stat(old).st_ino == inode, p       # renamed, not copied
        assert p.exists() and os.stat(p).st_ino != inode, p           # a new file in its place
        assert oct(os.stat(p).st_mode & 0o777) == "0o640", p
    # a job on gpu-node1: slurmctld logs its submission, that node's slurmd its launch
    job = client.submit_script("#!/bin/bash\ntrue\n", extra=["-p", "gpu", "-w", "gpu-node1", "-t", "1",
                                                               "-o", "/dev/null", "-J", "gpuhpc-test-logrotate"])
    try:
        wait_for(lambda: f"JobId={job}" in ctld.read_text(errors="replace"), 60,
                 "slurmctld to log the job in its new log")
        wait_for(lambda: f"Launching batch job {job} " in slurmd.read_text(errors="replace"), 90,
                 "gpu-node1's slurmd to log the job in its new log")
    finally:
        client.run(cmd.scancel(job), check=False)
    assert f"JobId={job}" not in ctld.with_name("slurmctld.log.1").read_text(errors="replace")
    assert f"Launching batch job {job} " not in slurmd.with_name(slurmd.name + ".1").read_text(errors="replace")
