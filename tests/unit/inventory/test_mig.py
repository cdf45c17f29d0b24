"""The MIG layout planner (gpuhpc/inventory/mig.py) against real `nvidia-smi mig -lgi` captures and
the nvidia-smi stand-in: apply, re-apply without change, a layout change that touches only what differs."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.inventory.mig import fit, placements, plan, plan_from_texts
from gpuhpc.inventory.smi import GpuInstance, parse_mig_lgi
from gpuhpc.spec.gpus import gpu_model
from standins.nvml_standin import state_from_listing, with_mig_geometry

REPO = Path(__file__).resolve().parents[3]
STANDIN = REPO / "ansible" / "local" / "roles" / "gpuhpc_test_smi_standin" / "files" / "nvidia-smi"
H100 = gpu_model("h100")
A100 = gpu_model("a100-40gb")


def test_placements_follow_nvidias_table():
    assert placements(H100, "1g.10gb") == [0, 1, 2, 3, 4, 5, 6]
    assert placements(H100, "1g.20gb") == [0, 2, 4, 6]
    assert placements(H100, "2g.20gb") == [0, 2, 4]
    assert placements(H100, "3g.40gb") == [0, 4]
    assert placements(H100, "4g.40gb") == [0]
    assert placements(H100, "7g.80gb") == [0]
    assert placements(gpu_model("a30"), "1g.6gb") == [0, 1, 2, 3]
    assert placements(H100, "9g.99gb") == []


def test_placements_match_a_real_capture(fixtures_dir):
    lgi = parse_mig_lgi((Path(fixtures_dir) / "nvidia-smi" / "mig-lgi-a100-40gb-7x1g.5gb.txt").read_text())
    assert sorted(int(g.placement.split(":")[0]) for g in lgi) == placements(A100, "1g.5gb")


def test_fit_places_largest_first_and_refuses_what_cannot_fit():
    assert fit(H100, [], ["1g.10gb", "3g.40gb", "2g.20gb"]) == [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]
    assert fit(H100, [("1g.10gb", 4)], ["3g.40gb", "3g.40gb"]) is None


def test_reapply_of_a_captured_layout_plans_nothing(fixtures_dir):
    text = (Path(fixtures_dir) / "nvidia-smi" / "mig-lgi-a100-40gb-7x1g.5gb.txt").read_text()
    p = plan_from_texts("a100-40gb", [["1g.5gb"] * 7], text, "0, Enabled\n")
    assert not p.changed and p.commands() == []


def test_layout_change_keeps_what_the_new_layout_still_wants(fixtures_dir):
    text = (Path(fixtures_dir) / "nvidia-smi" / "mig-lgi-a100-40gb-7x1g.5gb.txt").read_text()
    p = plan_from_texts("a100-40gb", [["3g.20gb"] + ["1g.5gb"] * 3], text, "0, Enabled\n")
    assert p.commands() == [["nvidia-smi", "mig", "-i", "0", "-dci", "-gi", "10,11,12,13"],
                            ["nvidia-smi", "mig", "-i", "0", "-dgi", "-gi", "10,11,12,13"],
                            ["nvidia-smi", "mig", "-i", "0", "-cgi", "3g.20gb:4", "-C"]]


def test_fragmented_gpu_is_recreated_whole():
    current = [GpuInstance(0, "1g.10gb", 19, 1, "1:1"), GpuInstance(0, "1g.10gb", 19, 2, "5:1")]
    # kept where they are, the two 1g.10gb leave no room for a 4g.40gb (it must start at slice 0)
    p = plan(H100, [["1g.10gb", "1g.10gb", "4g.40gb"]], current, {0: True})
    assert [g.gi for g in p.gpus[0].destroy] == [1, 2]
    assert p.gpus[0].create == [("4g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)]
    # whereas a 3g.40gb and a 2g.20gb fit around the one 1g.10gb that stays
    p = plan(H100, [["1g.10gb", "3g.40gb", "2g.20gb"]], current, {0: True})
    assert [g.gi for g in p.gpus[0].destroy] == [2]
    assert p.gpus[0].create == [("3g.40gb", 4), ("2g.20gb", 2)]


def test_mig_mode_is_switched_on_and_off():
    p = plan(H100, [["7g.80gb"], []], [GpuInstance(1, "1g.10gb", 19, 3, "0:1")], {0: False, 1: True})
    assert p.commands() == [["nvidia-smi", "-i", "0", "-mig", "1"],
                            ["nvidia-smi", "mig", "-i", "0", "-cgi", "7g.80gb:0", "-C"],
                            ["nvidia-smi", "mig", "-i", "1", "-dci", "-gi", "3"],
                            ["nvidia-smi", "mig", "-i", "1", "-dgi", "-gi", "3"],
                            ["nvidia-smi", "-i", "1", "-mig", "0"]]


@pytest.mark.parametrize("gpu_type, layouts, match", [
    ("l40s", [["1g.10gb"]], "no MIG profiles"),
    ("h100", [["1g.5gb"]], "not MIG profiles of h100"),
    ("h100", [["3g.40gb"] * 3], "does not fit"),
])
def test_bad_input_is_a_user_error(gpu_type, layouts, match):
    with pytest.raises(UserInputError, match=match):
        plan_from_texts(gpu_type, layouts, "", "0, Disabled\n")


def _smi(state: Path, *argv: str) -> str:
    proc = subprocess.run([str(STANDIN), *argv], env={**os.environ, "GPUHPC_NVML_STANDIN": str(state)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _converge(state: Path, layouts: list[list[str]]) -> list[list[str]]:
    modes = _smi(state, "--query-gpu=index,mig.mode.current", "--format=csv,noheader")
    lgi = subprocess.run([str(STANDIN), "mig", "-lgi"], env={**os.environ, "GPUHPC_NVML_STANDIN": str(state)},
                         capture_output=True, text=True, timeout=30).stdout
    commands = plan_from_texts("h100", layouts, lgi, modes).commands()
    for argv in commands:
        _smi(state, *argv[1:])
    return commands


def test_stand_in_converges_from_real_captures(tmp_path, fixtures_dir):
    smi = Path(fixtures_dir) / "nvidia-smi"
    state = with_mig_geometry(state_from_listing((smi / "L-h100-80gb-mig-7x1g.10gb.txt").read_text()),
                              (smi / "mig-lgip-h100-sxm5-80gb-4gpu.txt").read_text(), "h100")
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    target = [["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]]
    assert _converge(path, target)                       # changes the layout ...
    assert _converge(path, target) == []                 # ... and then there is nothing left to do
    listed = [line.split()[1] for line in _smi(path, "-L").splitlines() if line.strip().startswith("MIG")]
    assert sorted(listed) == sorted(target[0])


def test_cli_reads_json_and_answers_json(fixtures_dir):
    import sys

    lgi = (Path(fixtures_dir) / "nvidia-smi" / "mig-lgi-a100-40gb-7x1g.5gb.txt").read_text()
    doc = {"gpu_type": "a100-40gb", "layouts": [["1g.5gb"] * 7], "lgi": lgi, "modes": "0, Enabled\n"}
    ok = subprocess.run([sys.executable, "-m", "gpuhpc", "node", "mig-plan"], input=json.dumps(doc),
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"changed": False, "commands": [], "summary": []}, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "gpuhpc", "node", "mig-plan"], input="{}",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: mig-plan input:"), bad.stderr
