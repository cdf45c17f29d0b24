"""The local GPU cluster built by our Ansible roles behaves as docs/DEVELOPING.md promises.

That a second `scripts/cluster.sh up` changes nothing it need not and restarts nothing is asserted on
the converge tests/integration/quota/test_quota_slurm.py runs anyway (a new billing weight: only
slurm.conf's TRESBillingWeights, its reconfigure and the applied copy change; every daemon keeps its pid).
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from polling import wait_for

from .conftest import NODES

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")

pytestmark = pytest.mark.integration


def _job_state(slurm, job_id: str) -> str:
    rec = slurm.show_job(job_id) or {}
    return rec.get("JobState", "")


def _wait_done(slurm, job_id: str, timeout: float = 90) -> str:
    return wait_for(lambda: (s := _job_state(slurm, job_id)) in TERMINAL and s, timeout, f"job {job_id} to finish")


def test_plain_sinfo_without_slurm_conf_sees_every_node_idle():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}

    def states() -> dict[str, str]:
        out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], env=env,
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    # other suites' jobs may still be finishing; the nodes must all come back idle
    seen = wait_for(lambda: (s := states()) and all(s.get(n) == "idle" for n in NODES) and s, 120,
                    "every node idle in plain sinfo")
    assert set(NODES) <= set(seen)


def test_gres_h100_job_sees_two_devices(slurm, submit, tmp_path):
    out = tmp_path / "cvd.out"
    job_id = submit("#!/bin/bash\necho \"CVD=$CUDA_VISIBLE_DEVICES NODE=$SLURMD_NODENAME\"\n",
                    "--partition=gpu", "--gres=gpu:h100:2", "--time=2", f"--output={out}")
    assert _wait_done(slurm, job_id) == "COMPLETED"
    text = out.read_text()
    m = re.search(r"CVD=(\S*) NODE=(\S+)", text)
    assert m, text
    assert len(m.group(1).split(",")) == 2, text
    assert m.group(2) in ("gpu-node1", "gpu-node2")


@pytest.mark.parametrize("mig_type", ["1g.10gb", "3g.40gb"])
def test_mig_type_job_lands_on_mig_node(slurm, submit, tmp_path, mig_type):
    out = tmp_path / "mig.out"
    # the "all" partition spans every node: only the MIG type decides where the job goes
    job_id = submit("#!/bin/bash\necho \"NODE=$SLURMD_NODENAME CVD=$CUDA_VISIBLE_DEVICES\"\n",
                    "--partition=all", f"--gres=gpu:{mig_type}:1", "--time=2", f"--output={out}")
    assert _wait_done(slurm, job_id) == "COMPLETED"
    text = out.read_text()
    assert "NODE=mig-node1" in text, text
    assert re.search(r"CVD=\d+", text), text


def test_sacct_reports_gpu_tres(slurm, submit, tmp_path):
    job_id = submit("#!/bin/bash\ntrue\n", "--partition=gpu", "--gres=gpu:h100:1", "--time=2",
                    f"--output={tmp_path / 'acct.out'}")
    assert _wait_done(slurm, job_id) == "COMPLETED"

    def row():
        rows = [r for r in slurm.accounting(job_ids=[job_id]) if r.job_id == job_id]
        return rows and str(rows[0].state) == "COMPLETED" and rows[0]

    rec = wait_for(row, 60, f"sacct to record job {job_id}")
    assert rec.alloc_tres.get("gres/gpu") == "1", rec.alloc_tres
    assert rec.alloc_tres.get("gres/gpu:h100") == "1", rec.alloc_tres


def test_gpu_hi_job_preempts_and_requeues_gpu_job(slurm, submit, tmp_path):
    victim = submit("#!/bin/bash\nsleep 600\n", "--partition=gpu", "--nodelist=gpu-node1",
                    "--gres=gpu:h100:8", "--requeue", "--time=20", f"--output={tmp_path / 'victim.out'}")
    wait_for(lambda: _job_state(slurm, victim) == "RUNNING", 60, f"gpu job {victim} to run")

    urgent = submit("#!/bin/bash\nsleep 5\n", "--partition=gpu-hi", "--nodelist=gpu-node1",
                    "--gres=gpu:h100:8", "--time=2", f"--output={tmp_path / 'urgent.out'}")
    # GraceTime=30: the victim has no --signal, so (preempt_send_user_signal) nothing reaches it before the
    # grace ends; then Slurm requeues it and the gpu-hi job runs (~30 s: the ledger test preempts in `all`)
    wait_for(lambda: _job_state(slurm, urgent) in ("RUNNING", "COMPLETED"), 90, f"gpu-hi job {urgent} to start")
    rec = slurm.show_job(victim) or {}
    assert int(rec.get("Restarts", "0")) >= 1 or rec.get("JobState") in ("PENDING", "REQUEUED"), rec
    assert rec.get("JobState") != "CANCELLED", rec

