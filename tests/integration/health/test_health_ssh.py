"""The full health checks through the SSH runner (the node asked over SSH, as from a login
node): nvidia-smi, dmesg and ibstat are stand-ins on the remote PATH only, scripted per test;
gres.conf, /proc/mounts, the device files, the boot id and munge are the real ones. Nothing is applied."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuhpc.health import Action, HealthSpec, check_node
from gpuhpc.health.collect import BOOT_ID, run_checks
from gpuhpc.transport.ssh import SSHRunner

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def ssh_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/sshd.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    env = dict(kv.split("=", 1) for kv in out.split())
    return {"GPUHPC_SSH_HOST": env["GPUHPC_TEST_SSH_HOST"], "GPUHPC_SSH_KEY": env["GPUHPC_TEST_SSH_KEY"],
            "GPUHPC_SSH_KNOWN_HOSTS": env["GPUHPC_TEST_SSH_KNOWN_HOSTS"],
            **({"GPUHPC_SSH_SLURM_CONF": os.environ["SLURM_CONF"]} if os.environ.get("SLURM_CONF") else {})}


def _remote(tmp_path: Path, *, listing: str, counters: str, dmesg: str, ibstat: str | None = None) -> Path:
    bin_ = tmp_path / "remote-bin"
    bin_.mkdir(exist_ok=True)
    for name, text in (("listing", listing), ("counters", counters), ("dmesg.txt", dmesg), ("ibstat.txt", ibstat or "")):
        (tmp_path / name).write_text(text)
    scripts = {
        "nvidia-smi": f'case "$1" in -L) cat {tmp_path / "listing"} ;; --query-gpu=*) cat {tmp_path / "counters"} ;;'
                      f' *) exit 9 ;; esac',
        "dmesg": f"cat {tmp_path / 'dmesg.txt'}",
        **({"ibstat": f"cat {tmp_path / 'ibstat.txt'}"} if ibstat is not None else {}),
    }
    for name, body in scripts.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    return bin_


def _gpus(n: int) -> str:
    return "".join(f"GPU {i}: {H100} (UUID: GPU-{i:08d}-1111-2222-3333-444444444444)\n" for i in range(n))


CLEAN = "".join(f"{i}, 0, No, 0, 0, 0x0000000000000000, 1980, 1980\n" for i in range(8))


def _check(ssh_env, bin_: Path, node: str, tmp_path: Path, **spec):
    runner = SSHRunner.from_env(ssh_env)
    runner.env["PATH"] = f"{bin_}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    try:
        return check_node(node, runner=runner, spec=HealthSpec(state_dir=str(tmp_path / "state"), **spec))
    finally:
        runner.close()


def test_full_checks_over_ssh_find_an_xid_and_keep_a_mark(ssh_env, tmp_path):
    dmesg = "[  200.500000] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
    bin_ = _remote(tmp_path, listing=_gpus(8), counters=CLEAN, dmesg=dmesg)
    out = _check(ssh_env, bin_, "gpu-node1", tmp_path)
    status = {r.check: (r.status.value, r.message) for r in out.report.results}
    assert status["gpu-devices"][0] == "ok" and status["gpu-listing"] == ("ok", "h100 8")
    assert status["gpu-ecc"][0] == "ok" and status["gpu-clocks"][0] == "ok" and status["munge"][0] == "ok"
    assert status["xid"] == ("fail", "xid 79 on 0000:3b:00")
    assert out.decision.action is Action.DRAIN and out.decision.reason == "gpuhpc:hw: xid 79 on 0000:3b:00"
    assert not out.applied
    # a look without --apply leaves the XID for the run that acts; that run (here the checks
    # alone, so that nothing is drained) writes the mark on the node over SFTP, with the node's
    # boot id: the same XID is not news the next time
    mark = tmp_path / "state" / "xid-gpu-node1"
    assert not mark.exists()
    runner = SSHRunner.from_env(ssh_env)
    runner.env["PATH"] = f"{bin_}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    try:
        run_checks("gpu-node1", runner, HealthSpec(state_dir=str(tmp_path / "state")), record=True)
    finally:
        runner.close()
    boot = Path(BOOT_ID).read_text().strip()
    assert mark.read_text() == f"{boot} 200.5\n"
    again = _check(ssh_env, bin_, "gpu-node1", tmp_path)
    assert {r.check: r.status.value for r in again.report.results}["xid"] == "ok"


def test_lost_gpu_and_ib_port_over_ssh(ssh_env, tmp_path):
    ibstat = ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tRate: 400\n\t\tLink layer: InfiniBand\n"
              "CA 'mlx5_1'\n\tPort 1:\n\t\tState: Down\n\t\tRate: 10\n\t\tLink layer: InfiniBand\n")
    bin_ = _remote(tmp_path, listing=_gpus(7), counters=CLEAN[: CLEAN.rindex("7, ")], dmesg="", ibstat=ibstat)
    out = _check(ssh_env, bin_, "gpu-node2", tmp_path, ib_min_rate=400, ib_ports=2)
    status = {r.check: (r.status.value, r.message) for r in out.report.results}
    assert status["gpu-listing"] == ("fail", "gpu count 7/8 (h100 7/8)")
    assert status["ib"] == ("fail", "ib mlx5_1/1 down")
    assert out.decision.reason == "gpuhpc:hw: gpu count 7/8 (h100 7/8) (+1 more)"


def test_mig_layout_over_ssh(ssh_env, tmp_path):
    def mig(profiles: list[list[str]]) -> str:
        out = ""
        for g, profs in enumerate(profiles):
            out += f"GPU {g}: {H100} (UUID: GPU-{g:08d}-1111-2222-3333-444444444444)\n"
            out += "".join(f"  MIG {p:<11} Device {d:2d}: (UUID: MIG-{g:04d}{d:04d}-1111-2222-3333-444444444444)\n"
                           for d, p in enumerate(profs))
        return out

    good = mig([["1g.10gb"] * 7, ["3g.40gb"] * 2])
    bin_ = _remote(tmp_path, listing=good, counters=CLEAN[:40], dmesg="")
    out = _check(ssh_env, bin_, "mig-node1", tmp_path)
    assert {r.check: r.status.value for r in out.report.results}["gpu-listing"] == "ok"
    (tmp_path / "listing").write_text(mig([["1g.10gb"] * 7, ["4g.40gb"]]))
    out = _check(ssh_env, bin_, "mig-node1", tmp_path)
    bad = {r.check: r.message for r in out.report.results}["gpu-listing"]
    assert bad == "mig layout 8/9 (3g.40gb 0/2, 4g.40gb 1/0)", bad


def test_site_checks_over_ssh_probe_a_filesystem_and_count_cpus(ssh_env, tmp_path):
    """The filesystem probe (mktemp + rm) and the CPU count (getconf) run on the node over SSH;
    the CPUs are compared with gpu-node1's CPUs in Slurm (16), the memory with a number."""
    import subprocess as sp

    mnt = tmp_path / "fs"
    mnt.mkdir()
    bin_ = _remote(tmp_path, listing=_gpus(8), counters=CLEAN, dmesg="")
    spec = {"filesystems": (str(mnt),), "host_cpus": "slurm", "host_memory_mb": 1000}
    sp.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        out = _check(ssh_env, bin_, "gpu-node1", tmp_path, **spec)
        status = {r.check: (r.status.value, r.message) for r in out.report.results}
        assert status["filesystems"] == ("ok", "1 mounted and writable") and list(mnt.iterdir()) == []
        cpus = os.cpu_count()
        assert status["host"][0] == ("ok" if cpus >= 16 else "fail"), status["host"]
        if cpus < 16:
            assert status["host"][1] == f"host cpus {cpus}/16"
        sp.run(["mount", "-o", "remount,ro", str(mnt)], check=True, timeout=30)
        out = _check(ssh_env, bin_, "gpu-node1", tmp_path, **spec)
        assert {r.check: r.message for r in out.report.results}["filesystems"] == f"fs {mnt} read-only"
        assert not out.applied
    finally:
        sp.run(["umount", str(mnt)], capture_output=True, timeout=30)
