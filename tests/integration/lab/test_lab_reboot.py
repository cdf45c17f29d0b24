"""A rolling reboot on the lab's systemd hosts (issue 36.5 and its acceptance): `gpuhpc node reboot`
drains c1, lets its running job finish, has slurmd run RebootProgram (systemd reboots the host for
real: scripts/lab.sh's supervisor boots it again on the same overlay, as a power cycle would) and
waits until Slurm returns the node (nextstate=RESUME); c2's job runs on, untouched. Nothing runs
Ansible here: what brings the host back is what it boots with (enabled units, slurmd's scratch check).

gpuhpc runs where an admin's laptop would, over SSH to the controller host (GPUHPC_SSH_HOST), in the
lab's switch namespace (scripts/lab.sh ctl)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from polling import wait_for

from .conftest import LAB_DIR, LAB_SH, REPO, SHARED, Lab
from .test_lab import _node_states

pytestmark = pytest.mark.integration

GPUHPC = [str(REPO / ".venv" / "bin" / "python"), "-m", "gpuhpc"]


def _node(lab: Lab, name: str) -> dict[str, str]:
    """``scontrol show node NAME`` as Key=Value pairs (the fields this test reads have no spaces)."""
    out = lab.ssh("ctl", f"scontrol --oneliner show node {name}")
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def _hold_job(lab: Lab, node: str, release) -> str:
    """A job on ``node`` that runs until ``release`` (a file on /shared) exists."""
    path = "/shared/" + str(release.relative_to(SHARED))
    return lab.sbatch(f"#!/bin/bash\n#SBATCH -w {node} -N1 -n1 -t 10 -o /dev/null\n"
                      f"while [ ! -e {path} ]; do sleep 1; done\n")


def _gpuhpc_over_ssh(*args: str) -> subprocess.Popen:
    env = ["env", "GPUHPC_SSH_HOST=root@10.213.0.11", f"GPUHPC_SSH_KEY={LAB_DIR / 'id_ed25519'}",
           f"GPUHPC_SSH_KNOWN_HOSTS={LAB_DIR / 'known_hosts'}"]
    return subprocess.Popen(["bash", str(LAB_SH), "ctl", *env, *GPUHPC, *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_node_reboot_drains_c1_reboots_it_after_its_job_and_returns_it_idle_beside_c2s_job(lab: Lab):
    assert _node_states(lab) == {"c1": "idle", "c2": "idle"}
    conf = lab.ssh("ctl", "scontrol show config")
    assert "RebootProgram           = /usr/sbin/reboot" in conf, conf
    boot_id = lab.ssh("c1", "cat /proc/sys/kernel/random/boot_id").strip()
    boot_time = _node(lab, "c1")["BootTime"]
    work = SHARED / "reboot"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _reboot_c1_beside_c2s_job(lab, work, boot_id, boot_time)
    finally:    # the test's jobs end whatever happened (each waits for its file)
        (work / "release-c1").touch()
        (work / "release-c2").touch()


def _reboot_c1_beside_c2s_job(lab: Lab, work, boot_id: str, boot_time: str) -> None:
    on_c2 = _hold_job(lab, "c2", work / "release-c2")
    on_c1 = _hold_job(lab, "c1", work / "release-c1")
    wait_for(lambda: lab.job_state(on_c1) == "RUNNING" and lab.job_state(on_c2) == "RUNNING", 60,
             "both jobs to run")

    proc = _gpuhpc_over_ssh("node", "reboot", "c1", "--batch", "1", "--reason", "driver update", "--wait",
                            "--timeout", "240")
    try:
        # ASAP: c1 drains with the reason and waits for its job; the host is not rebooted yet
        wait_for(lambda: "REBOOT_REQUESTED" in _node(lab, "c1").get("State", ""), 60, "c1's reboot to be requested")
        state = lab.ssh("ctl", "scontrol show node c1")
        assert "DRAIN" in state and "Reason=driver update" in state, state
        # returned to service once booted, whatever it was before (24.11 would undrain it anyway)
        assert "NextState=RESUME" in state, state
        assert lab.ssh("c1", "cat /proc/sys/kernel/random/boot_id").strip() == boot_id
        assert lab.job_state(on_c1) == "RUNNING"
        (work / "release-c1").touch()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"{out}\n{err}"
    assert "rebooted and back: c1" in out, out

    # a new boot of c1 (its systemd's boot id, Slurm's BootTime), back in service without a reason
    assert lab.ssh("c1", "cat /proc/sys/kernel/random/boot_id").strip() != boot_id
    node = _node(lab, "c1")
    assert node["BootTime"] > boot_time, (node["BootTime"], boot_time)
    assert node["State"] == "IDLE" and node.get("Reason", "(null)") == "(null)", node
    # what the boot brought back: slurmd (an enabled unit, started after its scratch check) and /scratch
    assert lab.ssh("c1", "systemctl is-active munge slurmd").split() == ["active", "active"]
    assert lab.ssh("c1", "findmnt --noheadings --output TARGET /scratch").strip() == "/scratch"
    # c1's job finished (it was not killed by the reboot); c2's ran on through it
    assert lab.job_state(on_c1) == "COMPLETED"
    assert lab.job_state(on_c2) == "RUNNING"
    (work / "release-c2").touch()
    wait_for(lambda: lab.job_state(on_c2) == "COMPLETED", 60, "c2's job to complete")
    # and c1 takes new work
    assert lab.ssh("login", "srun -w c1 -N1 hostname", timeout=120).strip() == "c1"
