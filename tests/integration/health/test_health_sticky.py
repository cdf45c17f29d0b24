"""Drains that stick and drains that do not flap, on the real local cluster (gpu-node1, real
``scontrol``): the regular checks run as HealthCheckProgram runs them (``python -m gpuhpc.health
--apply``), with the repository's nvidia-smi stand-in (ansible/local/roles/gpuhpc_test_smi_standin)
answering from a private NVML stand-in state, a ``dmesg`` stand-in, and a private ``state_dir``.

- A double-bit ECC error drains the node ``gpuhpc:hw: ...``; once the counter is clean again,
  neither our clean run nor Slurm's own HealthCheckProgram run resumes it; a passing deep check
  (stand-in ``dcgmi`` / ``all_reduce_perf``) does. An XID 79 drains it; the next run (the XID
  already seen) leaves it drained; the admin's ``scontrol update State=RESUME`` returns it and
  the gate leaves it in service.
- One throttled sample drains nothing, two of three do (``perf:`` in the spec); a clean sample
  inside ``min_drain_s`` leaves the drain, one after it resumes; benign throttle bits never drain.

The node is shared with other tests: a drain of ours is undone in ``finally``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from health_node import NODE, HealthNode, undrained
from standins import nvml_standin

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SMI = REPO / "ansible" / "local" / "roles" / "gpuhpc_test_smi_standin" / "files" / "nvidia-smi"
XID79 = "[  200.500000] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
SLACK = 15          # s past one interval: the run itself on a loaded 2-core machine, polling


class Node(HealthNode):
    """gpu-node1's regular checks with stand-ins: ``gpu3(**health)`` scripts GPU 3's counters
    (the nvidia-smi stand-in's ``health`` keys), ``dmesg(text)`` the kernel log."""

    def __init__(self, tmp: Path, fixtures: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "node-bin"
        self.bin.mkdir()
        shutil.copy(SMI, self.bin / "nvidia-smi")
        (self.bin / "nvidia-smi").chmod(0o755)
        (self.bin / "dmesg").write_text(f"#!/bin/sh\ncat {tmp / 'dmesg.txt'}\n")
        (self.bin / "dmesg").chmod(0o755)
        self.dmesg("")
        self.base = nvml_standin.local_cluster_states(str(fixtures))[NODE]
        self.state_file = tmp / "nvml.json"
        self.gpu3()
        self.env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
        self.env.update(PATH=f"{self.bin}:{os.environ['PATH']}", GPUHPC_NVML_STANDIN=str(self.state_file))
        self.client = SlurmClient()

    def gpu3(self, **health) -> None:
        st = json.loads(json.dumps(self.base))
        if health:
            st["gpus"][3]["health"] = health
        nvml_standin.write_state(str(self.state_file), st)

    def dmesg(self, text: str) -> None:
        (self.tmp / "dmesg.txt").write_text(text)

    def spec(self, name: str, text: str = "") -> Path:
        p = self.tmp / f"{name}.yml"
        p.write_text(f"state_dir: {self.tmp / 'state'}\n{text}")
        return p


@pytest.fixture
def node(tmp_path, fixtures_dir):
    yield from undrained(Node(tmp_path, fixtures_dir))


def _deep(env: dict) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "gpuhpc", "node", "health", NODE, "--deep", "--apply", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1) and proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_hardware_drain_sticks_through_clean_runs_until_deep_check_or_admin(node, standins, full_runs):
    use, deep_env = standins
    interval = int(node.client.config()["HealthCheckInterval"].split()[0])
    runs = full_runs(NODE)
    spec = node.spec("spec")

    # a double-bit ECC error on GPU 3 drains the node for hardware
    node.gpu3(ecc_uncorrected=2)
    rc, out = node.regular(spec)
    assert rc == 1 and out["decision"]["action"] == "drain" and out["applied"], out
    state, reason = node.state()
    assert "DRAIN" in state and reason.startswith("gpuhpc:hw: gpu3 ecc uncorrected 2"), (state, reason)

    # the counter clean again (the volatile count restarts with a reboot): a clean run leaves the drain ...
    node.gpu3()
    rc, out = node.regular(spec)
    assert rc == 0 and out["decision"]["action"] == "none" and "hardware fault" in out["decision"]["why"], out
    # ... and so does Slurm's own HealthCheckProgram run, which finds the node healthy too
    runs.wait_for_one_since(runs.now(), interval + SLACK)
    assert node.state()[1].startswith("gpuhpc:hw: gpu3 ecc uncorrected 2"), node.state()

    # a passing deep check returns it
    use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8.txt")
    rc, out = _deep(deep_env)
    assert rc == 0 and out["decision"]["action"] == "resume" and out["applied"], out
    assert not node.drained()

    # an XID 79: drained; the next run has seen that XID already, and still leaves the drain
    node.dmesg(XID79)
    rc, out = node.regular(spec)
    assert out["status"]["xid"] == ("fail", "xid 79 on 0000:3b:00") and out["applied"], out
    assert node.state()[1].startswith("gpuhpc:hw: xid 79 on 0000:3b:00"), node.state()
    rc, out = node.regular(spec)
    assert rc == 0 and out["status"]["xid"] == ("ok", "no new XID") and out["decision"]["action"] == "none", out
    assert node.state()[1].startswith("gpuhpc:hw: xid 79 on 0000:3b:00"), node.state()
    # the admin's path: scontrol update State=RESUME; the gate then leaves the node in service
    node.client.resume_node(NODE)
    rc, out = node.regular(spec)
    assert rc == 0 and out["decision"]["action"] == "none" and not node.drained(), out


def test_perf_drain_needs_two_of_three_samples_and_lasts_min_drain_s(node):
    held = node.spec("held", "perf: {fail_samples: 2, window: 3, min_drain_s: 3600}\n")
    short = node.spec("short", "perf: {fail_samples: 2, window: 3, min_drain_s: 0}\n")

    node.gpu3(throttle="0x0000000000000040", sm_clock=900)          # HwThermalSlowdown
    rc, out = node.regular(held)                                    # one sample: a warning, no drain
    assert rc == 0 and out["status"]["gpu-clocks"][0] == "warn" and out["decision"]["action"] == "none", out
    assert not node.drained()
    rc, out = node.regular(held)                                    # two of the last three: drained
    assert rc == 1 and out["decision"]["action"] == "drain" and out["applied"], out
    state, reason = node.state()
    assert "DRAIN" in state and reason.startswith("gpuhpc:perf: gpu3 throttled (hw thermal"), (state, reason)

    node.gpu3()
    rc, out = node.regular(held)                                    # clean, inside min_drain_s: stays
    assert rc == 0 and out["decision"]["action"] == "none" and "3600 s" in out["decision"]["why"], out
    assert node.drained()
    rc, out = node.regular(short)                                   # past min_drain_s: back
    assert out["decision"]["action"] == "resume" and out["applied"] and not node.drained(), out

    # benign bits (GpuIdle + SwPowerCap) with low clocks, sample after sample: never a drain
    node.gpu3(throttle="0x0000000000000005", sm_clock=600)
    for _ in range(3):
        rc, out = node.regular(short)
        assert rc == 0 and out["status"]["gpu-clocks"][0] == "ok" and not node.drained(), out
