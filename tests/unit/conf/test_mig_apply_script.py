"""gpuhpc_nvidia_gpu's gpuhpc-mig-apply (the boot-time unit's script): the commands it derives from
what nvidia-smi reports after a reboot (MIG mode kept, instances gone), fed recorded answers instead
of running anything."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "ansible" / "roles" / "gpuhpc_nvidia_gpu" / "files" / "gpuhpc-mig-apply"

LAYOUT = {"node": "mig-node1", "clients": ["nvidia-persistenced"], "gpus": [
    {"index": 0, "profiles": ["1g.10gb", "1g.10gb", "3g.40gb"], "create": "3g.40gb:0,1g.10gb:4,1g.10gb:5"},
    {"index": 1, "profiles": ["3g.40gb", "3g.40gb"], "create": "3g.40gb:0,3g.40gb:4"},
    {"index": 2, "profiles": [], "create": ""}]}

# `nvidia-smi mig -lgi` as the driver prints it (GPU 0 intact, GPU 1 rebuilt by hand with one slice)
LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 3g.40gb          9        2          0:4     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19        9          4:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19       10          5:1     |
+-------------------------------------------------------+
|   1  MIG 3g.40gb          9        1          4:4     |
+-------------------------------------------------------+
"""


@pytest.fixture()
def script():
    loader = importlib.machinery.SourceFileLoader("gpuhpc_mig_apply", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpuhpc_mig_apply", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _answers(mod, monkeypatch, modes: str, lgi: str) -> None:
    def run(argv, check=True):
        out = modes if argv[1].startswith("--query-gpu") else lgi
        return subprocess.CompletedProcess(argv, 0 if out else 6, out or "No GPU instances found: Not Found", "")
    monkeypatch.setattr(mod, "run", run)


def test_after_a_reboot_every_gpu_in_mig_mode_is_rebuilt(script, monkeypatch):
    _answers(script, monkeypatch, "0, Enabled\n1, Enabled\n2, Disabled\n", "")
    assert script.boot_commands(LAYOUT) == [
        ["nvidia-smi", "mig", "-i", "0", "-cgi", "3g.40gb:0,1g.10gb:4,1g.10gb:5", "-C"],
        ["nvidia-smi", "mig", "-i", "1", "-cgi", "3g.40gb:0,3g.40gb:4", "-C"]]


def test_an_intact_gpu_is_left_and_a_differing_one_is_destroyed_first(script, monkeypatch):
    _answers(script, monkeypatch, "0, Enabled\n1, Enabled\n2, Enabled\n", LGI)
    assert script.boot_commands(LAYOUT) == [
        ["nvidia-smi", "mig", "-i", "1", "-dci"], ["nvidia-smi", "mig", "-i", "1", "-dgi"],
        ["nvidia-smi", "mig", "-i", "1", "-cgi", "3g.40gb:0,3g.40gb:4", "-C"],
        ["nvidia-smi", "-i", "2", "-mig", "0"]]


def test_a_gpu_whose_mode_was_lost_gets_it_back_before_its_instances(script, monkeypatch):
    _answers(script, monkeypatch, "0, Enabled\n1, Disabled\n2, Disabled\n", LGI.replace("|   1  MIG 3g.40gb          9        1          4:4     |\n", ""))
    assert script.boot_commands(LAYOUT) == [
        ["nvidia-smi", "-i", "1", "-mig", "1"], ["nvidia-smi", "mig", "-i", "1", "-cgi", "3g.40gb:0,3g.40gb:4", "-C"]]
