"""gpuhpc_nvme_scratch from the installed collection on a scratch root (connection local): a loop
device stands in for the node's NVMe drive and is formatted XFS and mounted for real; fstab, mdadm.conf
and slurmd's systemd drop-in live in the test's root. What makes the scratch reboot-safe:

- fstab names the filesystem by UUID with nofail (and a device timeout), so the mount comes back when
  the drive comes back under another name, and a dead drive never stops a boot in emergency mode;
- slurmd's drop-in orders it after the mount (RequiresMountsFor) and runs gpuhpc-slurmd-precheck
  before it starts, which refuses a node whose scratch is not mounted (here with SLURM_CONF pointing
  nowhere: the drain itself is the lab's test, on a real slurmctld);
- a second run changes nothing.

The RAID 0 path (mdadm.conf, the initramfs) needs the md driver, which this machine's kernel lacks.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, ansible_env, recap

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

NODE = "scratch-node1"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=check)


class ScratchHost:
    """This machine as one compute node of a small spec whose scratch is one loop device."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.mnt = tmp / "scratch"
        self.image = tmp / "nvme.img"
        with open(self.image, "wb") as f:
            f.truncate(320 * 2**20)              # XFS's smallest filesystem is 300 MiB
        self.dev = _run("losetup", "--find", "--show", str(self.image)).stdout.strip()
        self.fstab = tmp / "fstab"
        self.spec = tmp / "spec.yaml"
        self.spec.write_text(yaml.safe_dump({
            "name": "scratchtest", "controller": {"hosts": ["localhost"]},
            "runtime": {"slurm_user": "root", "conf_dir": str(tmp / "etc"), "state_save_location": str(tmp / "state"),
                        "slurmd_spool_dir": str(tmp / "spool"), "log_dir": str(tmp / "log"), "run_dir": str(tmp / "run"),
                        "proctrack": "linuxproc", "task_plugins": ["none"], "job_container": "tmpfs"},
            "node_groups": [{"name": "cpu", "hostname": "scratch-node{n}", "count": 1, "sockets": 1,
                             "cores_per_socket": 2, "memory_mb": 1000,
                             "scratch": {"path": str(self.mnt), "devices": [self.dev]}}],
            "partitions": [{"name": "debug", "nodes": ["ALL"], "default": True}],
        }, sort_keys=False))
        self.inventory = tmp / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "gpuhpc_slurm_common_spec": str(self.spec), "gpuhpc_slurm_common_install_packages": False,
            "gpuhpc_slurm_common_applied_dir": str(tmp / "applied"), "gpuhpc_slurm_common_billing_file": "",
            "gpuhpc_slurm_common_logrotate_dir": str(tmp / "logrotate.d"),
            "gpuhpc_slurm_common_slurmd_precheck": True,
            "gpuhpc_slurm_common_slurmd_precheck_path": str(tmp / "sbin" / "gpuhpc-slurmd-precheck"),
            "gpuhpc_slurm_compute_nodes": [NODE],
            # no slurmd of this spec runs here: the job_container.conf handler has nothing to restart
            "gpuhpc_slurm_compute_service_manager": "none",
            "gpuhpc_nvme_scratch_packages": ["xfsprogs"],     # one drive: no mdadm
            "gpuhpc_nvme_scratch_systemd_dir": str(tmp / "systemd")}}}}, sort_keys=False))
        self.playbook = tmp / "scratch.yml"
        self.playbook.write_text(yaml.safe_dump([{
            "name": "gpuhpc_nvme_scratch on a scratch root", "hosts": "all", "gather_facts": False,
            # facts outrank the role's private vars, which name /etc/fstab and /etc/mdadm/mdadm.conf
            "pre_tasks": [{"name": "Point the role at the test's fstab and mdadm.conf", "ansible.builtin.set_fact": {
                "_gpuhpc_nvme_scratch_fstab": str(self.fstab),
                "_gpuhpc_nvme_scratch_mdadm_conf": str(tmp / "mdadm.conf")}}],
            "roles": [{"role": "gpuhpc.cluster.gpuhpc_slurm_common"}, {"role": "gpuhpc.cluster.gpuhpc_nvme_scratch"}]}]))

    def run(self) -> tuple[dict[str, int], str]:
        # --skip-tags verify: its job-namespace probe would pick this machine's shared-cluster slurmd
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(self.inventory),
                               str(self.playbook), "--skip-tags", "verify"], cwd=REPO, env=ansible_env(self.tmp),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        return recap(proc), proc.stdout

    def precheck(self, *checks: str) -> subprocess.CompletedProcess:
        """slurmd's ExecStartPre as the drop-in names it, with SLURM_CONF pointing nowhere (no drain)."""
        dropin = (self.tmp / "systemd" / "slurmd.service.d" / "gpuhpc-scratch.conf").read_text()
        argv = next(line for line in dropin.splitlines() if line.startswith("ExecStartPre=")).split("=", 1)[1].split()
        assert argv[0] == "/usr/bin/env" and argv[1].startswith("SLURM_CONF=")
        return subprocess.run(argv[2:], env={**os.environ, "SLURM_CONF": str(self.tmp / "no-such-slurm.conf")},
                              capture_output=True, text=True, timeout=120)

    def close(self) -> None:
        if os.path.ismount(self.mnt):
            _run("umount", str(self.mnt), check=False)
        for line in _run("losetup", "--associated", str(self.image), check=False).stdout.splitlines():
            _run("losetup", "--detach", line.split(":")[0], check=False)


@pytest.fixture(scope="module")
def scratch(collection, tmp_path_factory):
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.skip("needs root and loop devices (losetup) to stand a drive in")
    host = ScratchHost(tmp_path_factory.mktemp("scratch-root", numbered=True))
    try:
        first = host.run()
        second = host.run()
        yield host, first, second
    finally:
        host.close()


def test_scratch_is_mounted_by_uuid_with_nofail_and_a_second_run_changes_nothing(scratch):
    host, (counts, out), (again, out2) = scratch
    assert counts["failed"] == 0 and counts["changed"] > 0
    uuid = _run("blkid", "-o", "value", "-s", "UUID", host.dev).stdout.strip()
    assert _run("blkid", "-o", "value", "-s", "TYPE", host.dev).stdout.strip() == "xfs"
    assert host.fstab.read_text().splitlines()[-1] == (
        f"UUID={uuid} {host.mnt} xfs defaults,noatime,nofail,x-systemd.device-timeout=30s 0 0")
    assert os.path.ismount(host.mnt)
    assert again == {"changed": 0, "failed": 0}, out2[-4000:]


def test_slurmd_requires_the_mount_and_refuses_to_start_without_it(scratch):
    host, _, _ = scratch
    dropin = (host.tmp / "systemd" / "slurmd.service.d" / "gpuhpc-scratch.conf").read_text()
    assert f"\nRequiresMountsFor={host.mnt}\n" in dropin, dropin
    assert re.search(rf"^ExecStartPre=/usr/bin/env SLURM_CONF={host.tmp}/etc/slurm.conf {host.tmp}/sbin/gpuhpc-slurmd-precheck "
                     rf"{NODE} mount:{host.mnt}$", dropin, re.M), dropin
    ok = host.precheck()
    assert ok.returncode == 0, ok.stderr
    # scratch missing (here: unmounted; at boot: a dead drive, nofail): slurmd does not start
    _run("umount", str(host.mnt))
    refused = host.precheck()
    assert refused.returncode == 1
    assert f"slurmd not started on {NODE}: scratch {host.mnt} is not mounted" in refused.stderr, refused.stderr
    assert f"could not drain {NODE}" in refused.stderr           # no slurmctld here: the lab drains


def test_the_drive_comes_back_under_another_name_and_mounts_from_fstab(scratch):
    """A reboot may name the drive differently: fstab's UUID finds it (a device path would not)."""
    host, _, _ = scratch
    if os.path.ismount(host.mnt):
        _run("umount", str(host.mnt))
    old = host.dev
    other = _run("losetup", "--find", "--show", str(host.image)).stdout.strip()   # the same drive, a new name
    _run("losetup", "--detach", old)
    assert other != old
    _run("mount", "--fstab", str(host.fstab), str(host.mnt))
    assert os.path.ismount(host.mnt)
    assert _run("findmnt", "-n", "-o", "SOURCE", str(host.mnt)).stdout.strip() == other
    assert host.precheck().returncode == 0
