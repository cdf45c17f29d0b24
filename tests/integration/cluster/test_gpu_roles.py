"""gpuhpc_nvidia_gpu and gpuhpc_gpudirect_rdma from the installed collection, run for real on this
machine (connection local), in check mode and in apply mode.

This machine has no GPU and no HCA: the driver, persistence mode, fabric manager, DCGM and
nvidia-peermem steps are skipped, each with its one-line reason. The MIG steps run against the
nvidia-smi stand-in (first on PATH), whose state starts from the real captures in
tests/fixtures/nvidia-smi (`nvidia-smi -L` of a 7x 1g.10gb H100, `mig -lgip` of an H100 SXM5):
apply, re-apply without change (no nvidia-smi mig create/destroy call, changed=0), and a layout
change that destroys and creates only what differs, regenerates gres.conf and tells the daemons.
Both roles converge once per module, in one play (check, apply, re-apply); the layout change, the
boot-time unit after a "reboot" of the stand-in and the slurmd -G isolation check start from that
state. The GPUDirect decision and DGX OS run once, as four hosts of one --check play, each with its
own recorded driver, OFED and /etc/dgx-release facts (gpuhpc_slurm_common's context and pending
decision only, and no MIG layout: the converged host covers those). Nothing touches the shared cluster: the spec's conf_dir, the applied record and
the NCCL profile live under the test's tmp directory.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuhpc.conf.render import render_nccl_profiles
from gpuhpc.spec.cluster import load_spec
from standins.nvml_standin import state_from_listing, with_mig_geometry

from .conftest import REPO, ansible_env, recap

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

STANDIN = REPO / "ansible" / "local" / "roles" / "gpuhpc_test_smi_standin" / "files" / "nvidia-smi"
SEVEN = [["1g.10gb"] * 7, ["3g.40gb", "3g.40gb"]]
NVIDIA, RDMA = "gpuhpc_nvidia_gpu", "gpuhpc_gpudirect_rdma"


def _spec(tmp: Path, layouts: list[list[str]]) -> dict:
    return {
        "name": "gputest", "controller": {"hosts": ["localhost"]},
        "runtime": {"slurm_user": "root", "conf_dir": str(tmp / "etc"), "state_save_location": str(tmp / "state"),
                    "slurmd_spool_dir": str(tmp / "spool"), "log_dir": str(tmp / "log"), "run_dir": str(tmp / "run"),
                    "proctrack": "linuxproc", "task_plugins": ["none"],
                    "unconstrained_gpus_reason": "a test in a temporary root; the GPUs are the nvidia-smi stand-in's"},
        "nccl": {"ib_gid_index": 3, "socket_ifname": "=eth0"},
        "node_groups": [{"name": "mig", "hostname": "mig-node{n}", "count": 1, "sockets": 1, "cores_per_socket": 2,
                         "memory_mb": 1000, "ib_hcas": ["mlx5_0", "mlx5_3", "mlx5_1"],
                         "gpus": {"type": "h100", "count": 2, "mig": layouts,
                                  # slurmd -G stats every File=: the slices' device files live in the test's root
                                  # ({index}: the nvidia-caps minor the stand-in's "driver" gives)
                                  "mig_device": str(tmp / "dev" / "nvidia-cap{index}")}}],
        "partitions": [{"name": "debug", "nodes": ["ALL"], "default": True}],
    }


class GpuHost:
    """This machine as one GPU node of a small spec, with the nvidia-smi stand-in first on PATH."""

    def __init__(self, tmp: Path, fixtures_dir: Path) -> None:
        self.tmp = tmp
        self.spec = tmp / "spec.yaml"
        self.state = tmp / "smi-state.json"
        self.log = tmp / "smi-calls.jsonl"
        self.bin = tmp / "bin"
        self.bin.mkdir()
        (tmp / "dev").mkdir()     # the stand-in makes nvidia-capM there for each GPU instance
        (tmp / "systemd").mkdir()     # the driver's packages' units, as this host had them
        for unit in ("nvidia-persistenced", "nvidia-fabricmanager"):
            (tmp / "systemd" / f"{unit}.service").write_text(f"[Unit]\nDescription={unit}\n")
        shutil.copy(STANDIN, self.bin / "nvidia-smi")
        smi = fixtures_dir / "nvidia-smi"
        state = state_from_listing((smi / "L-h100-80gb-mig-7x1g.10gb.txt").read_text())
        gpu1 = json.loads(json.dumps(state["gpus"][0]))
        # GPU 1: whole, MIG mode off, and a client holds it: enabling MIG stays pending until a reset
        gpu1.update(uuid=gpu1["uuid"][:-4] + "0001", mig=[], mig_mode="Disabled", mode_change_needs_reset=True)
        state["gpus"].append(gpu1)
        self.state.write_text(json.dumps(with_mig_geometry(state, (smi / "mig-lgip-h100-sxm5-80gb-4gpu.txt").read_text(),
                                                           "h100")))
        self.inventory = tmp / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "gpuhpc_slurm_common_spec": str(self.spec), "gpuhpc_slurm_common_install_packages": False,
            "gpuhpc_slurm_common_applied_dir": str(tmp / "applied"), "gpuhpc_slurm_common_billing_file": "",
            "gpuhpc_slurm_common_logrotate_dir": str(tmp / "logrotate.d"),
            "gpuhpc_nvidia_gpu_node": "mig-node1", "gpuhpc_slurm_common_mig_minors_file": str(tmp / "mig-minors"), "gpuhpc_gpudirect_rdma_node": "mig-node1",
            "gpuhpc_nvidia_gpu_mig_script": str(tmp / "sbin" / "gpuhpc-mig-apply"),
            "gpuhpc_nvidia_gpu_mig_layout_file": str(tmp / "gpuhpc" / "mig-layout.json"),
            "gpuhpc_nvidia_gpu_systemd_dir": str(tmp / "systemd"),
            # the GPU services slurmd starts after, MIG or not (fabric manager: an NVSwitch system's)
            "gpuhpc_nvidia_gpu_slurmd_after": ["nvidia-persistenced", "nvidia-fabricmanager"],
            "gpuhpc_slurm_common_slurmd_precheck": True,
            "gpuhpc_slurm_common_slurmd_precheck_path": str(tmp / "sbin" / "gpuhpc-slurmd-precheck"),
            "gpuhpc_gpudirect_rdma_nccl_env_file": str(tmp / "gpuhpc" / "nccl.env")}}}}, sort_keys=False))

    def write_spec(self, layouts: list[list[str]]) -> None:
        self.spec.write_text(yaml.safe_dump(_spec(self.tmp, layouts), sort_keys=False))

    def run(self, role: str | tuple[str, ...], *extra: str, ok: bool = True) -> tuple[dict[str, int], str, list[list[str]]]:
        """ansible-playbook with gpuhpc_slurm_common and ``role`` (or roles, in one play); (recap,
        output, nvidia-smi calls). ``ok``: the play must succeed."""
        roles = (role,) if isinstance(role, str) else role
        playbook = self.tmp / f"{'+'.join(roles)}.yml"
        playbook.write_text(yaml.safe_dump([{
            "name": f"{' and '.join(roles)} on this machine", "hosts": "all", "gather_facts": False,
            "roles": [{"role": "gpuhpc.cluster.gpuhpc_slurm_common"}, *({"role": f"gpuhpc.cluster.{r}"} for r in roles)],
            # as site.yml ends: the next run's restart-or-reconfigure decision compares with this record
            "tasks": [{"name": "Record the applied Slurm config", "ansible.builtin.include_role": {
                "name": "gpuhpc.cluster.gpuhpc_slurm_common", "tasks_from": "applied.yml"}, "when": "not ansible_check_mode"}]}]))
        self.log.write_text("")
        env = self.env()
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(self.inventory),
                               str(playbook), *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 or not ok, proc.stdout[-6000:] + proc.stderr[-2000:]
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return recap(proc), proc.stdout, calls

    def env(self) -> dict[str, str]:
        env = ansible_env(self.tmp)
        env.update(PATH=f"{self.bin}{os.pathsep}{env['PATH']}", GPUHPC_NVML_STANDIN=str(self.state),
                   GPUHPC_SMI_STANDIN_LOG=str(self.log), GPUHPC_SMI_STANDIN_BOOT_FILE=str(self.tmp / "run" / "boot-id"),
                   GPUHPC_SMI_STANDIN_MIG_MINORS=str(self.tmp / "mig-minors"), GPUHPC_SMI_STANDIN_DEV_DIR=str(self.tmp / "dev"),
                   ANSIBLE_PIPELINING="1")
        return env

    def reboot(self) -> None:
        """What a reboot leaves the stand-in: /run emptied (MIG mode stays, instances go)."""
        (self.tmp / "run" / "boot-id").unlink()

    def boot_unit(self) -> subprocess.CompletedProcess:
        """The boot-time unit's ExecStart, as systemd runs it before slurmd."""
        unit = (self.tmp / "systemd" / "gpuhpc-mig.service").read_text()
        argv = next(line for line in unit.splitlines() if line.startswith("ExecStart=")).split("=", 1)[1].split()
        self.log.write_text("")
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=60)

    def instances(self) -> list[list[tuple[str, int]]]:
        st = json.loads(self.state.read_text())
        return [sorted((m["profile"], m.get("placement", -1)) for m in g.get("mig") or []) for g in st["gpus"]]


def _mig_changes(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if ("mig" in c[:1] and {"-cgi", "-dgi", "-dci"} & set(c)) or "-mig" in c]


@pytest.fixture(scope="module")
def converged(collection, tmp_path_factory, fixtures_dir) -> dict:
    """Both roles in one play, converged once for the module: check mode, apply, re-apply. Each run's
    (recap, output, nvidia-smi calls) and what it left; the tests below assert on them, and the
    layout change starts from the converged host."""
    h = GpuHost(tmp_path_factory.mktemp("gpu-roles"), Path(fixtures_dir))
    h.write_spec(SEVEN)
    both = (NVIDIA, RDMA)
    res: dict = {"host": h}
    res["check"] = h.run(both, "--check", "--diff")
    res["check_left"] = (h.instances(), (h.tmp / "gpuhpc" / "nccl.env").exists())
    res["apply"] = h.run(both)
    res["apply_left"] = (h.instances(), (h.tmp / "gpuhpc" / "nccl.env").read_text(),
                         render_nccl_profiles(load_spec(h.spec))["nccl-mig.env"])
    res["reapply"] = h.run(both)
    res["gres"] = (h.tmp / "etc" / "gres.conf").read_text()
    return res


def test_nvidia_gpu_mig_check_apply_and_reapply(converged):
    # check mode: reports the change, runs no MIG command, writes nothing
    counts, out, calls = converged["check"]
    assert counts["failed"] == 0 and counts["changed"] > 0
    assert "GPU 1: MIG mode enabled; create 3g.40gb at 0, 3g.40gb at 4" in out, out[-4000:]
    assert _mig_changes(calls) == []
    assert converged["check_left"][0][1] == []
    assert "driver, persistence mode, fabric manager and DCGM skipped: no NVIDIA GPU on the PCI bus" in out, out[-4000:]

    # apply: GPU 0 already has its 7x 1g.10gb (kept), GPU 1 gets MIG mode and two 3g.40gb
    counts, out, calls = converged["apply"]
    assert counts["failed"] == 0
    assert _mig_changes(calls) == [["-i", "1", "-mig", "1"], ["mig", "-i", "1", "-cgi", "3g.40gb:0,3g.40gb:4", "-C"]]
    # the mode change stayed pending (a client holds GPU 1): gpuhpc-mig-apply reset the GPU before -cgi
    assert calls.index(["-i", "1", "-r"]) < calls.index(["mig", "-i", "1", "-cgi", "3g.40gb:0,3g.40gb:4", "-C"]), calls
    assert converged["apply_left"][0] == [[("1g.10gb", s) for s in range(7)], [("3g.40gb", 0), ("3g.40gb", 4)]]
    assert "MIG layout of mig-node1 changed: slurmd" in out, out[-4000:]
    # isolation: what slurmd itself detects from the rendered gres.conf has a device file per slice
    assert "node mig-node1: slurmd -G gives all 9 GPU(s)/MIG slice(s) a device file" in out, out[-4000:]
    # ... the GPU instances' nvidia-caps devices, numbered by the driver's mig-minors (gpuN/giI/access),
    # not the spec's sequence: GPU 0's seven 1g.10gb are GIs 0-6, GPU 1's two 3g.40gb GIs 1 and 2
    assert f"Type=1g.10gb File={converged['host'].tmp}/dev/nvidia-cap[3,12,21,30,39,48,57]\n" in converged["gres"]
    assert f"Type=3g.40gb File={converged['host'].tmp}/dev/nvidia-cap[147,156]\n" in converged["gres"]
    assert "gpuhpc-mig.service not enabled: systemd is not running on this host" in out, out[-4000:]

    # re-apply: the GPUs already have the layout: no MIG command at all, nothing changed
    counts, out, calls = converged["reapply"]
    assert _mig_changes(calls) == [] and counts == {"changed": 0, "failed": 0}, out[-4000:]
    assert "MIG layout of mig-node1 changed" not in out


def test_slurmd_starts_after_the_gpu_services_and_not_when_fabric_manager_failed(converged):
    """slurmd's drop-in (MIG or not): Wants= and After= persistenced and fabric manager (their units
    exist here), and an ExecStartPre that refuses to start slurmd while one is not active, draining
    the node with the reason (on this machine, without systemd, neither is active; SLURM_CONF points
    nowhere, so nothing is drained: the lab drains for real)."""
    h = converged["host"]
    dropin = (h.tmp / "systemd" / "slurmd.service.d" / "gpuhpc-gpu.conf").read_text()
    units = "nvidia-persistenced.service nvidia-fabricmanager.service"
    assert f"\nWants={units}\nAfter={units}\n" in dropin, dropin
    line = next(x for x in dropin.splitlines() if x.startswith("ExecStartPre="))
    argv = line.split("=", 1)[1].split()
    assert argv[:2] == ["/usr/bin/env", f"SLURM_CONF={h.tmp}/etc/slurm.conf"], line
    assert argv[2:] == [str(h.tmp / "sbin" / "gpuhpc-slurmd-precheck"), "mig-node1",
                        "active:nvidia-persistenced.service", "active:nvidia-fabricmanager.service"], line
    proc = subprocess.run(argv[2:], env={**os.environ, "SLURM_CONF": str(h.tmp / "no-such-slurm.conf")},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "slurmd not started on mig-node1: nvidia-persistenced.service is " in proc.stderr, proc.stderr
    assert "; nvidia-fabricmanager.service is " in proc.stderr, proc.stderr


def test_nvidia_gpu_mig_layout_change(converged):
    """From the converged host (the re-apply above ran no MIG command): a layout change."""
    h = converged["host"]
    # layout change on GPU 0 only: three 1g.10gb go, one 3g.40gb comes (the other four stay)
    gres_before = converged["gres"]
    h.write_spec([["1g.10gb"] * 4 + ["3g.40gb"], ["3g.40gb", "3g.40gb"]])
    counts, out, calls = h.run(NVIDIA)
    assert counts["failed"] == 0
    assert _mig_changes(calls) == [["mig", "-i", "0", "-dci", "-gi", "4,5,6"], ["mig", "-i", "0", "-dgi", "-gi", "4,5,6"],
                                   ["mig", "-i", "0", "-cgi", "3g.40gb:4", "-C"]]
    assert h.instances() == [[("1g.10gb", s) for s in range(4)] + [("3g.40gb", 4)], [("3g.40gb", 0), ("3g.40gb", 4)]]
    gres = (h.tmp / "etc" / "gres.conf").read_text()
    assert gres != gres_before, gres
    # File= of each slice: its GPU instance's access capability as the driver numbers it (mig-minors
    # gpuN/giI/access): GPU 0's 1g.10gb are GIs 0-3, its 3g.40gb GI 4, GPU 1's 3g.40gb GIs 1 and 2
    assert f"Type=1g.10gb File={h.tmp}/dev/nvidia-cap[3,12,21,30]\n" in gres, gres
    assert f"Type=3g.40gb File={h.tmp}/dev/nvidia-cap[39,147,156]\n" in gres, gres
    # the daemons are told: the spec's new Gres= counts (slurm.conf and gres.conf) and the new MIG devices
    for reason in ("nodename=mig-node1: slurmctld, slurmd", "gres.conf: reconfigure", "MIG layout of mig-node1 changed: slurmd"):
        assert reason in out, out[-4000:]


def test_mig_layout_comes_back_after_a_reboot(converged):
    """The boot-time unit (before slurmd, which requires it) puts the layout back: after a "reboot" the
    stand-in keeps MIG mode and loses every instance, as real GPUs do; the unit's ExecStart rebuilds
    the spec's layout, and on an intact layout runs no MIG command."""
    h = converged["host"]
    unit = (h.tmp / "systemd" / "gpuhpc-mig.service").read_text()
    for line in ("Before=slurmd.service nvidia-persistenced.service nvidia-fabricmanager.service nvidia-dcgm.service",
                 "Type=oneshot", "RequiredBy=slurmd.service"):
        assert line in unit, unit
    layout = json.loads((h.tmp / "gpuhpc" / "mig-layout.json").read_text())
    assert layout["clients"] == ["nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm"]
    before = h.instances()
    assert before[0] and before[1]
    h.reboot()
    listing = subprocess.run([str(h.bin / "nvidia-smi"), "-L"], env=h.env(), capture_output=True, text=True, timeout=30)
    assert "MIG" not in listing.stdout and h.instances() == [[], []]     # the first call after boot sees none
    assert [g["mig_mode"] for g in json.loads(h.state.read_text())["gpus"]] == ["Enabled", "Enabled"]
    proc = h.boot_unit()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert h.instances() == before
    assert "MIG layout of mig-node1 applied: 2 command(s)" in proc.stdout, proc.stdout
    again = h.boot_unit()
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr
    assert _mig_changes([json.loads(line) for line in h.log.read_text().splitlines()]) == []


def test_slurmd_without_device_files_for_the_slices_fails_the_play(converged):
    """AutoDetect=nvml renders Count=-only MIG lines; this slurmd (Debian 12's) has no gpu_nvml.so, so
    slurmd -G detects no slice with a device file: the play fails, saying why and what to change."""
    h = converged["host"]
    spec = yaml.safe_load(h.spec.read_text())
    spec["runtime"]["gres_autodetect"] = "nvml"
    h.spec.write_text(yaml.safe_dump(spec, sort_keys=False))
    playbook = h.tmp / f"{NVIDIA}.yml"
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(h.inventory),
                           str(playbook), "--tags", "configure,verify"], cwd=REPO, env=h.env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert "Type=1g.10gb Count=4" in (h.tmp / "etc" / "gres.conf").read_text()     # the layout change's
    assert ("node mig-node1: slurmd -G detects 0 GPU(s)/MIG slice(s), the spec has 7: jobs would not be confined to "
            "their GPUs. This slurmd has no NVML plugin (gpu_nvml.so)") in proc.stdout, proc.stdout[-4000:]


def test_gpudirect_rdma_packages_nccl_profile_and_skips(converged):
    counts, out, _ = converged["check"]
    assert counts["failed"] == 0 and counts["changed"] > 0
    assert converged["check_left"][1] is False          # check mode wrote no NCCL profile
    counts, out, _ = converged["apply"]
    assert counts["failed"] == 0
    assert ("GPUDirect RDMA (DMA-BUF or nvidia-peermem) skipped: no NVIDIA driver loaded (/proc/driver/nvidia/version), "
            "no RDMA device (/sys/class/infiniband)") in out, out[-4000:]
    # the NCCL profile is the one `gpuhpc conf render` would write for the node group (one template)
    _, profile, rendered = converged["apply_left"]
    assert profile == rendered
    assert 'NCCL_IB_HCA="${NCCL_IB_HCA-=mlx5_0:1,mlx5_3:1,mlx5_1:1}"' in profile, profile
    counts, out, _ = converged["reapply"]
    assert counts == {"changed": 0, "failed": 0}, out[-4000:]


PROPRIETARY_535 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:15:33 UTC 2024"
# the keys DGX OS writes to /etc/dgx-release (DGX_SERIAL_NUMBER left out); the roles look for DGX_* keys
DGX_RELEASE = ('DGX_NAME="DGX Server"\nDGX_PRETTY_NAME="NVIDIA DGX Server"\nDGX_SWBUILD_DATE="2021-08-18-20-11-12"\n'
               'DGX_SWBUILD_VERSION="5.1.0"\nDGX_COMMIT_ID="6933cd7"\nDGX_PLATFORM="DGX Server for DGX A100"\n\n'
               'DGX_OTA_VERSION="5.2.0"\n')


# the lines of one task's output (up to the next TASK)
IN_TASK = r"(?:(?!TASK \[)[^\n]*\n)*?"
# four hosts of one check-mode play (all this machine): each sees its own driver, OFED and DGX OS facts
DECISIONS = {
    "open550": ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build", False, False),
    "prop535ofed": (PROPRIETARY_535, True, False),
    "prop535inbox": (PROPRIETARY_535, False, False),
    "dgx": (PROPRIETARY_535, False, True),
}


@pytest.fixture(scope="module")
def decisions(collection, tmp_path_factory, fixtures_dir) -> dict[str, str]:
    """gpuhpc_nvidia_gpu and gpuhpc_gpudirect_rdma in --check on four hosts at once, their /proc, /sys
    and /etc facts files of the test's own (this kernel is >= 5.12; one HCA; an OFED's ofed_info or
    none; DGX OS's /etc/dgx-release or none): each host's output lines."""
    h = GpuHost(tmp_path_factory.mktemp("gpudirect"), Path(fixtures_dir))
    h.write_spec(SEVEN)
    (h.tmp / "infiniband" / "mlx5_0").mkdir(parents=True)
    (h.tmp / "ofed_info").write_text("#!/bin/sh\n")
    (h.tmp / "dgx-release").write_text(DGX_RELEASE)
    none = str(h.tmp / "no-such-file")
    inventory = yaml.safe_load(h.inventory.read_text())
    base = inventory["all"]["hosts"].pop("localhost")
    for name, (nvrm, ofed, dgx) in DECISIONS.items():
        (h.tmp / f"nvrm-{name}").write_text(nvrm + "\n")
        inventory["all"]["hosts"][name] = {**base, "test_facts": {
            "_gpuhpc_gpudirect_rdma_nvrm_file": str(h.tmp / f"nvrm-{name}"),
            "_gpuhpc_gpudirect_rdma_ib_class": str(h.tmp / "infiniband"), "_gpuhpc_gpudirect_rdma_peermem_module": none,
            "_gpuhpc_gpudirect_rdma_ofed_info": str(h.tmp / "ofed_info") if ofed else none,
            "_gpuhpc_gpudirect_rdma_dgx_release": str(h.tmp / "dgx-release") if dgx else none,
            "_gpuhpc_nvidia_gpu_dgx_release": str(h.tmp / "dgx-release") if dgx else none}}
    h.inventory.write_text(yaml.safe_dump(inventory))
    playbook = h.tmp / "decisions.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "GPU roles on four hosts", "hosts": "all", "gather_facts": False,
        # facts (set_fact) outrank the roles' private vars, which point at /proc, /sys and /etc
        "pre_tasks": [{"name": "Point the roles at this host's facts files",
                       "ansible.builtin.set_fact": {k: f"{{{{ test_facts['{k}'] }}}}" for k in
                                                    inventory["all"]["hosts"]["dgx"]["test_facts"]}},
                      # the decisions read gpuhpc_slurm_common's outputs (the spec's context and the
                      # daemons' pending actions), not the Slurm files it writes: those and the MIG
                      # layout (--skip-tags mig) are the converged host's, above
                      *({"name": f"gpuhpc_slurm_common's {part}", "ansible.builtin.import_role": {
                          "name": "gpuhpc.cluster.gpuhpc_slurm_common", "tasks_from": f"{part}.yml"}}
                        for part in ("context", "pending"))],
        "roles": [{"role": f"gpuhpc.cluster.{NVIDIA}"}, {"role": f"gpuhpc.cluster.{RDMA}"}]}]))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(h.inventory), str(playbook),
                           "--check", "--forks", "4", "--skip-tags", "mig"], cwd=REPO, env=h.env(), capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout.replace(str(h.tmp), "TMP")
    per_host = {name: "\n".join(re.findall(rf"^(?:ok|changed|fatal|skipping): \[{name}\].*$|^\[ERROR\].*$", out, re.M)
                                 + re.findall(rf'\[{name}\][^\n]*=> \{{\n\s+"msg": "([^\n]*)"', out))
                for name in DECISIONS}
    per_host["recap"] = out[out.rindex("PLAY RECAP"):]
    per_host["all"] = out
    return per_host


def test_gpudirect_rdma_picks_dmabuf_peermem_or_fails(decisions):
    """Open modules of 550 -> DMA-BUF (inbox RDMA is enough); proprietary 535 -> nvidia-peermem, which
    loads only against an OFED's ib_core; proprietary 535 with inbox RDMA -> neither can load: that host
    fails, saying why and what to change."""
    out = decisions["all"]
    assert re.search(r"open550\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", decisions["recap"]), decisions["recap"]
    assert re.search(r"prop535ofed\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", decisions["recap"])
    assert re.search(r"prop535inbox\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=1", decisions["recap"])
    assert "GPUDirect RDMA through DMA-BUF: kernel" in decisions["open550"], decisions["open550"]
    assert "GPUDirect RDMA through nvidia-peermem: kernel" in decisions["prop535ofed"], decisions["prop535ofed"]
    assert "HCAs mlx5_0" in decisions["open550"]
    assert re.search(rf"TASK \[[^\]]*Load nvidia-peermem at boot\][^\n]*\n{IN_TASK}(changed|ok): \[prop535ofed\]", out), out[-4000:]
    assert not re.search(r"(changed|ok): \[open550\].*nvidia-peermem.conf", out)
    assert ("GPUDirect RDMA cannot load on mig-node1: driver 535 (proprietary modules), kernel" in out
            and "the inbox RDMA stack has no peer-memory API, so nvidia-peermem cannot load; install the open "
                "kernel modules (nvidia-kernel-open-dkms), or set gpuhpc_gpudirect_rdma_ofed to mofed or doca" in out), out[-4000:]


def test_dgx_os_keeps_its_driver_ofed_and_peermem_loader(decisions):
    """Recorded DGX OS facts (/etc/dgx-release): the driver, OFED and nvidia-peermem loader are left
    alone, each role says so in one line, and a proprietary driver without an OFED of ours is no error."""
    dgx, out = decisions["dgx"], decisions["all"]
    assert re.search(r"dgx\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", decisions["recap"]), decisions["recap"]
    assert "driver, fabric manager and DCGM packages left as they are: DGX OS (TMP/dgx-release) installs its own" in dgx, dgx
    assert ("gpudirect_rdma on DGX OS (TMP/dgx-release): its driver, OFED and nvidia-peermem loader are left as they "
            "are (no OFED install, no modules-load file); only the NCCL profile is written") in dgx, dgx
    for task in ("Load nvidia-peermem at boot", "Install the RDMA packages", "Do not load nvidia-peermem where DMA-BUF"):
        assert not re.search(rf"TASK \[[^\]]*{re.escape(task)}[^\n]*\n{IN_TASK}(ok|changed): \[dgx\]", out), task
