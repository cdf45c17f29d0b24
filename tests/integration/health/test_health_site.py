"""The site checks (issue 35.9) drain and return a node of the real local cluster (gpu-node1, real
``scontrol``): the regular checks run as HealthCheckProgram runs them (``python -m gpuhpc.health
--apply``), with stand-ins from ``tests/standins`` first on PATH (``nvidia-smi-site`` in front of
the local cluster's nvidia-smi stand-in, ``getconf-cpus``) and a private ``state_dir``:

- GPU processes left while Slurm runs no job on the node drain it ``gpuhpc:dev: gpu processes
  left: ...``; gone, the next run returns it. While a real job runs there, the same processes are
  the job's: no drain.
- Fewer online CPUs than the node's CPUs in Slurm drain it ``gpuhpc:hw: host cpus 15/16``; the
  count back, the drain sticks (hardware) until the admin's resume. Memory is read from the real
  ``/proc/meminfo``.
- A filesystem of the spec (a tmpfs the test mounts) remounted read-only drains the node
  ``gpuhpc:sw: fs ... read-only``, unmounted ``... not mounted``; back read-write, the node returns.
  The write probe (mktemp + rm as root) leaves no file behind.
- An IB port whose LinkDownedCounter grew since the last run (recorded ibstat / perfquery through
  ``ib-recorded``) drains it ``gpuhpc:dev: ib mlx5_0/1 link downed +3``; no growth, it returns.
- ``gpudirect: true`` on this machine, whose real ``/proc/modules`` (if any) has no nvidia_peermem, drains it
  ``gpuhpc:sw: nv_peermem not loaded``; GPUDirect off in the spec, it returns.
- A GPU's PCIe link at x8 of x16, an inactive NVLink, a GPU's fabric registration in progress
  (recorded outputs through the stand-in) drain it ``gpuhpc:hw: ...``; fixed, the drain stays until
  the admin's resume.

The node is shared with other tests: a drain of ours is undone in ``finally``."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhpc.health.checks import jobs_running
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for
from health_node import NODE, HealthNode, undrained
from standins import nvml_standin

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SMI = REPO / "ansible" / "local" / "roles" / "gpuhpc_test_smi_standin" / "files" / "nvidia-smi"
STANDINS = REPO / "tests" / "standins"
UNIT_FIX = REPO / "tests" / "unit" / "health" / "fixtures"


class Site(HealthNode):
    """gpu-node1's regular checks with the site stand-ins: ``apps(text)`` scripts the GPU
    processes, ``cpus(n)`` the online CPUs."""

    def __init__(self, tmp: Path, fixtures: Path) -> None:
        self.tmp = tmp
        bin_ = tmp / "node-bin"
        bin_.mkdir()
        shutil.copy(STANDINS / "nvidia-smi-site", bin_ / "nvidia-smi")
        shutil.copy(STANDINS / "getconf-cpus", bin_ / "getconf")
        for tool in ("ibstat", "perfquery"):
            shutil.copy(STANDINS / "ib-recorded", bin_ / tool)
        self.ib = tmp / "ib"
        self.ib.mkdir()
        self.site = tmp / "smi-site"
        self.site.mkdir()
        state = tmp / "nvml.json"
        nvml_standin.write_state(str(state), nvml_standin.local_cluster_states(str(fixtures))[NODE])
        self.env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
        self.env.update(PATH=f"{bin_}:{os.environ['PATH']}", GPUHPC_NVML_STANDIN=str(state),
                        GPUHPC_SMI_NEXT=str(SMI), GPUHPC_SMI_SITE_DIR=str(self.site),
                        GPUHPC_STANDIN_CPUS_FILE=str(tmp / "cpus"), GPUHPC_STANDIN_IB_DIR=str(self.ib))
        self.client = SlurmClient()
        self.apps("")

    def apps(self, text: str) -> None:
        (self.site / "compute-apps").write_text(text)

    def cpus(self, n: int) -> None:
        (self.tmp / "cpus").write_text(f"{n}\n")

    def spec(self, text: str = "") -> Path:
        p = self.tmp / "spec.yml"
        p.write_text(f"state_dir: {self.tmp / 'state'}\n{text}")
        return p


@pytest.fixture
def site(tmp_path, fixtures_dir):
    yield from undrained(Site(tmp_path, fixtures_dir))


def test_gpu_processes_left_without_a_job_drain_dev_and_return_when_gone(site, tmp_path):
    spec = site.spec()
    leftover = (UNIT_FIX / "query-compute-apps-leftover.txt").read_text()

    # a real job on the node: the GPU processes are its own, nothing drains
    job = site.client.submit_script("#!/bin/bash\nsleep 120\n", extra=[
        "--partition=gpu", f"--nodelist={NODE}", "--ntasks=1", "--time=3", "--job-name=gpuhpc-health-procs",
        f"--output={tmp_path}/%j.out"])
    try:
        wait_for(lambda: (q := site.client.queue(job_ids=[job])) and q[0].state.raw == "RUNNING", 60,
                 f"job {job} to run on {NODE}")
        site.apps(leftover)
        rc, out = site.regular(spec)
        assert out["status"]["gpu-procs"] == ("ok", "jobs run here: their GPU processes are theirs"), out
        assert rc == 0 and not site.drained(), out
    finally:
        site.client.cancel(job)

    # no job (the cancelled one gone from the node): the same processes are left over -> drained (dev)
    wait_for(lambda: not jobs_running(site.state()[0]), 60, f"{NODE} to run no job")
    rc, out = site.regular(spec)
    assert rc == 1 and out["decision"]["action"] == "drain" and out["applied"], out
    state, reason = site.state()
    left = "gpuhpc:dev: gpu processes left: 1002127 python, 1002311 python3.11"
    assert "DRAIN" in state and reason.startswith(left), (state, reason)
    # the processes gone: the next run returns the node
    site.apps("")
    rc, out = site.regular(spec)
    assert rc == 0 and out["decision"]["action"] == "resume" and out["applied"] and not site.drained(), out


def test_fewer_cpus_than_slurm_knows_drain_hw_until_the_admin_resumes(site):
    cpus = site.client.node(NODE).cpus
    with open("/proc/meminfo") as fh:
        mem_mb = int(next(line for line in fh if line.startswith("MemTotal:")).split()[1]) // 1024
    spec = site.spec("host: {memory_mb: 1000, cpus: slurm}\n")

    site.cpus(cpus)
    rc, out = site.regular(spec)
    assert out["status"]["host"] == ("ok", f"{mem_mb} MB, {cpus} cpus") and rc == 0, out   # the real /proc/meminfo

    site.cpus(cpus - 1)                    # a CPU the kernel took offline
    rc, out = site.regular(spec)
    assert rc == 1 and out["applied"], out
    state, reason = site.state()
    assert "DRAIN" in state and reason.startswith(f"gpuhpc:hw: host cpus {cpus - 1}/{cpus}"), (state, reason)
    # all CPUs back (as after a reboot): the hardware drain stays ...
    site.cpus(cpus)
    rc, out = site.regular(spec)
    assert rc == 0 and out["decision"]["action"] == "none" and "hardware fault" in out["decision"]["why"], out
    assert site.state()[1].startswith(f"gpuhpc:hw: host cpus {cpus - 1}/{cpus}")
    # ... until the admin resumes the node; the gate then leaves it in service
    site.client.resume_node(NODE)
    rc, out = site.regular(spec)
    assert rc == 0 and out["decision"]["action"] == "none" and not site.drained(), out


def test_filesystem_read_only_or_unmounted_drains_sw_and_returns(site, tmp_path):
    mnt = tmp_path / "scratch"
    mnt.mkdir()
    spec = site.spec(f"filesystems: [{mnt}]\n")

    def mount(*opts: str) -> None:
        subprocess.run(["mount", *opts], check=True, capture_output=True, timeout=30)

    mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt))
    try:
        rc, out = site.regular(spec)
        assert out["status"]["filesystems"] == ("ok", "1 mounted and writable") and rc == 0, out
        assert list(mnt.iterdir()) == []            # the probe's file was deleted

        mount("-o", "remount,ro", str(mnt))
        rc, out = site.regular(spec)
        assert rc == 1 and out["applied"], out
        state, reason = site.state()
        assert "DRAIN" in state and reason.startswith(f"gpuhpc:sw: fs {mnt} read-only"), (state, reason)
        mount("-o", "remount,rw", str(mnt))
        rc, out = site.regular(spec)
        assert rc == 0 and out["decision"]["action"] == "resume" and not site.drained(), out

        subprocess.run(["umount", str(mnt)], check=True, timeout=30)
        rc, out = site.regular(spec)
        assert rc == 1 and site.state()[1].startswith(f"gpuhpc:sw: fs {mnt} not mounted"), (out, site.state())
        assert list(mnt.iterdir()) == []            # nothing written into the directory below the mount
        mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt))
        rc, out = site.regular(spec)
        assert rc == 0 and out["decision"]["action"] == "resume" and not site.drained(), out
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def _fabric_in_progress(q: str) -> str:
    """The recorded ``nvidia-smi -q`` with one GPU's fabric registration still in progress."""
    done = "State                             : Completed\n        Status                            : Success"
    assert done in q
    stuck = done.replace("Completed", "In Progress").replace("Success", "N/A")
    return q.replace(done, stuck, 1)


@pytest.mark.parametrize("name, spec, healthy, broken, reason", [
    ("pcie", "", "query-pcie-h100x8-idle.txt", "query-pcie-h100x8-gpu2-x8.txt", "gpuhpc:hw: pcie gpu2 x8/x16"),
    ("nvlink", "nvlink: {links: 18, min_gbps: 26}\n", "nvlink-status-h100x8.txt",
     "nvlink-status-h100x8-gpu5-link7-inactive.txt", "gpuhpc:hw: nvlink gpu5 link 7 inactive"),
    ("q", "fabric_manager: true\n", "q-text", "q-text-in-progress",
     "gpuhpc:hw: fabric manager gpu 00000000:19:00.0 in progress n/a"),
], ids=["pcie-width", "nvlink", "fabric-manager"])
def test_link_and_fabric_faults_drain_hw_until_the_admin_resumes(site, fixtures_dir, name, spec, healthy, broken,
                                                                 reason):
    # the capture gpu-node1's NVML stand-in state is made from
    q = (fixtures_dir / "nvidia-smi" / "q-text-h100-sxm-8gpu-535.161.08.txt").read_text()
    texts = {"q-text": q, "q-text-in-progress": _fabric_in_progress(q)}

    def answer(fixture: str) -> None:
        (site.site / name).write_text(texts.get(fixture) or (UNIT_FIX / fixture).read_text())

    spec_file = site.spec(spec)
    answer(healthy)
    rc, out = site.regular(spec_file)
    check = {"q": "fabric-manager"}.get(name, name)
    assert rc == 0 and out["status"][check][0] == "ok", out
    answer(broken)
    rc, out = site.regular(spec_file)
    assert rc == 1 and out["applied"], out
    state, reason_now = site.state()
    assert "DRAIN" in state and reason_now.startswith(reason), (state, reason_now)
    answer(healthy)                        # reseated, retrained, restarted: the hardware drain stays ...
    rc, out = site.regular(spec_file)
    assert rc == 0 and out["decision"]["action"] == "none" and site.state()[1].startswith(reason), out
    site.client.resume_node(NODE)          # ... until the admin returns the node
    rc, out = site.regular(spec_file)
    assert rc == 0 and out["decision"]["action"] == "none" and not site.drained(), out


def test_ib_link_flaps_drain_dev_and_return_without_new_ones(site):
    (site.ib / "ibstat").write_text("CA 'mlx5_0'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n"
                                    "\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 400\n"
                                    "\t\tLink layer: InfiniBand\n")

    def perfquery(fixture: str) -> None:
        (site.ib / "perfquery-mlx5_0-1").write_text((UNIT_FIX / fixture).read_text())

    spec = site.spec("ib: {min_rate: 400, ports: 1}\n")
    perfquery("perfquery-port-1-down.txt")                     # an old flap: recorded, not news
    rc, out = site.regular(spec)
    assert rc == 0 and out["status"]["ib-errors"] == ("ok", "1 ports: counters recorded"), out
    perfquery("perfquery-port-flapped.txt")                    # three flaps since the last run
    rc, out = site.regular(spec)
    assert rc == 1 and out["applied"], out
    state, reason = site.state()
    assert "DRAIN" in state and reason.startswith("gpuhpc:dev: ib mlx5_0/1 link downed +3"), (state, reason)
    rc, out = site.regular(spec)                               # no new flap: back in service
    assert rc == 0 and out["decision"]["action"] == "resume" and not site.drained(), out


def test_gpudirect_without_nv_peermem_drains_sw_and_returns_when_the_spec_drops_it(site):
    # the real /proc/modules (none at all in a container without modules: nothing proves the module loaded)
    modules = Path("/proc/modules").read_text() if os.path.exists("/proc/modules") else ""
    assert not {line.split()[0] for line in modules.splitlines() if line.strip()} & {"nvidia_peermem", "nv_peer_mem"}
    rc, out = site.regular(site.spec("gpudirect: true\n"))
    assert rc == 1 and out["applied"], out
    state, reason = site.state()
    assert "DRAIN" in state and reason.startswith("gpuhpc:sw: nv_peermem not loaded"), (state, reason)
    rc, out = site.regular(site.spec(""))
    assert rc == 0 and out["decision"]["action"] == "resume" and not site.drained(), out
