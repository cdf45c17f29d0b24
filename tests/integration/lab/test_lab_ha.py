"""The lab's two controllers (see conftest.py): ctl is the primary slurmctld, login the backup, and
both keep StateSaveLocation on /shared, the lab's stand-in for the NFS a site mounts there
(ansible/inventories/lab/cluster.yaml, SlurmctldTimeout=10)."""
from __future__ import annotations

import re
import shutil
import time

import pytest

from polling import wait_for

from .conftest import REPO, SHARED, Lab

pytestmark = pytest.mark.integration

STATE = "/shared/slurm/state"

# holds its node until released (a test never waits a fixed job length)
HELD_JOB = """#!/bin/bash
#SBATCH --nodelist=c1 --time=10 --output=/shared/ha/%j.out
touch /shared/ha/$SLURM_JOB_ID.started
while [ ! -e /shared/ha/release ]; do sleep 0.2; done
"""
NEW_JOB = """#!/bin/bash
#SBATCH --nodelist=c2 --time=5 --output=/shared/ha/%j.out
hostname > /shared/ha/$SLURM_JOB_ID.ran
"""


def _ping(lab: Lab) -> dict[str, str]:
    """{'primary': 'UP'|'DOWN', 'backup': ...} from `scontrol ping` on the login host."""
    out = lab.ssh("login", "scontrol ping", check=False)
    return dict(re.findall(r"Slurmctld\((primary|backup)\) at \S+ is (UP|DOWN)", out))


def _squeue_state(lab: Lab, job: str) -> str:
    """The job's state and comment as the controller in charge answers ('' while none answers)."""
    return lab.ssh("login", f"timeout 20 squeue --noheader --jobs {job} --format '%T %k' 2>/dev/null || true",
                   check=False).strip()


def test_the_controllers_share_their_state_directory(lab: Lab):
    assert _ping(lab) == {"primary": "UP", "backup": "UP"}
    # one directory (the same inode), the Slurm user's on both, holding the primary's saved state
    seen = [lab.ssh(h, f"stat -c '%U %i' {STATE}; ls {STATE}").split() for h in ("ctl", "login")]
    assert seen[0] == seen[1] and seen[0][0] == "slurm" and "node_state" in seen[0], seen


def test_the_backup_takes_over_with_the_running_job_and_accepts_a_new_one(lab: Lab):
    work = SHARED / "ha"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    job = lab.sbatch(HELD_JOB)
    jobs = [job]
    try:
        wait_for(lambda: (work / f"{job}.started").exists(), 90, f"job {job} to start")
        # the primary saves its state a few seconds after a change (Slurm batches the writes): a crash
        # just after a job started would lose that start. A job update after the start, then the
        # save after it: what the backup must find
        # (the saved file itself holds the comment: a save that began before the update, and ended
        # after it, does not)
        saved = SHARED / "slurm" / "state" / "job_state"
        lab.ssh("login", f"scontrol update jobid={job} comment=before-failover")
        wait_for(lambda: saved.exists() and b"before-failover" in saved.read_bytes(), 30,
                 "the primary to save the running job with its comment")
        # the primary's slurmctld dies (SIGKILL: no shutdown, no hand-over; the unit has no Restart=)
        t = time.monotonic()
        lab.ssh("ctl", "systemctl kill --signal=SIGKILL slurmctld")
        wait_for(lambda: lab.ssh("ctl", "systemctl is-active slurmctld", check=False).strip() != "active", 30,
                 "the primary's slurmctld to stop")
        # the backup takes control (after SlurmctldTimeout) from the state the primary saved on /shared
        assert wait_for(lambda: _squeue_state(lab, job), 90, "the backup controller to answer") == "RUNNING before-failover"
        takeover_s = time.monotonic() - t
        assert _ping(lab) == {"primary": "DOWN", "backup": "UP"}
        # a new job is accepted and runs, and the running one goes on to complete
        new = lab.sbatch(NEW_JOB)
        jobs.append(new)
        wait_for(lambda: (work / f"{new}.ran").exists(), 90, f"the new job {new} to run")
        assert (work / f"{new}.ran").read_text().strip() == "c2"
        assert _squeue_state(lab, job) == "RUNNING before-failover"
        (work / "release").touch()
        wait_for(lambda: lab.job_state(job) == "COMPLETED", 90, f"job {job} to complete")
        print(f"backup in control {takeover_s:.1f} s after the primary died")
    finally:
        # the primary comes back and takes control again (it asks the backup to hand over before it
        # answers): later tests find the cluster as the play left it
        lab.ssh("ctl", "systemctl start slurmctld")
        wait_for(lambda: _ping(lab) == {"primary": "UP", "backup": "UP"}, 120, "both controllers to answer again")
        (work / "release").touch()
        for j in jobs:
            lab.ssh("login", f"scancel {j}", check=False)
    assert lab.ssh("ctl", "systemctl is-active slurmctld").strip() == "active"
    assert lab.job_state(new) == "COMPLETED"


def test_the_play_stops_when_the_state_directory_is_not_shared(lab: Lab, tmp_path):
    # the same cluster with StateSaveLocation on each controller's own disk: the controller role's
    # check alone (no daemon is touched), through a playbook that loads the spec and runs it
    local = "/var/spool/slurmctld-unshared"
    spec = tmp_path / "cluster.yaml"
    spec.write_text((REPO / "ansible/inventories/lab/cluster.yaml").read_text()
                    .replace(f"state_save_location: {STATE}", f"state_save_location: {local}"))
    try:
        proc = lab.play("-e", f"gpuhpc_slurm_common_spec={spec}",
                        playbook=str(REPO / "tests/integration/lab/ha_unshared.yml"), timeout=300)
        assert proc.returncode != 0, proc.stdout[-3000:]
        fatal = [line for line in proc.stdout.splitlines() if line.startswith("fatal: [login]")]
        assert len(fatal) == 1 and f"runtime.state_save_location {local} is not shared" in fatal[0], proc.stdout[-3000:]
        assert "fatal: [ctl]" not in proc.stdout
    finally:
        for host in ("ctl", "login"):
            lab.ssh(host, f"rm -rf {local}", check=False)
