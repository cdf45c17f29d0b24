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


# ------------------------------------------------------------------ gres.conf File= from the driver's minors
def _minors(gpus: int) -> str:
    """/proc/driver/nvidia-caps/mig-minors as the driver writes it (its numbering: gres.mig_caps_minor)."""
    from gpuhpc.inventory.gres import mig_caps_minor

    lines = ["config 1", "monitor 2"]
    for g in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {mig_caps_minor(g, gi)}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {mig_caps_minor(g, gi, ci)}" for ci in range(8)]
    return "\n".join(lines) + "\n"


def test_mig_minors_parse_the_drivers_file():
    from gpuhpc.inventory.mig import parse_mig_minors

    got = parse_mig_minors(_minors(2))
    assert got[(0, 0, None)] == 3 and got[(0, 0, 0)] == 4 and got[(0, 1, None)] == 12 and got[(1, 2, None)] == 156
    # slurmd's own NVML detection on an H100 (tests/fixtures/nvidia-smi/slurmd-G-...): nvidia-cap291 is GPU 2's GI 2
    assert parse_mig_minors(_minors(3))[(2, 2, None)] == 291
    assert parse_mig_minors("config 1\nmonitor 2\n") == {}


def test_slices_take_their_gpu_instances_minor_in_placement_order(fixtures_dir):
    from gpuhpc.inventory.mig import parse_mig_minors, slice_cap_minors

    # a real A100 with 7x 1g.5gb: the driver gave GI ids 7-13 (placements 0-6)
    lgi = parse_mig_lgi((Path(fixtures_dir) / "nvidia-smi" / "mig-lgi-a100-40gb-7x1g.5gb.txt").read_text())
    minors = parse_mig_minors(_minors(1))
    assert slice_cap_minors([["1g.5gb"] * 7], lgi, minors) == [[3 + 9 * gi for gi in range(7, 14)]]
    with pytest.raises(ValueError, match="GPU 0: the layout has 1 2g.10gb, nvidia-smi mig -lgi lists 0"):
        slice_cap_minors([["2g.10gb"]], lgi, minors)
    with pytest.raises(ValueError, match="no gpu0/gi7/access line"):
        slice_cap_minors([["1g.5gb"]], lgi, {})


def test_a_mig_nodes_gres_rows_name_the_drivers_devices(tmp_path):
    from gpuhpc.conf.context import build_context
    from gpuhpc.inventory.mig import node_gres_lines
    from gpuhpc.spec.cluster import load_spec

    (tmp_path / "c.yaml").write_text(
        "name: c\ncontroller: {hosts: [ctl]}\n"
        "node_groups:\n- {name: g, hostname: 'g{n}', count: 2, sockets: 1, cores_per_socket: 4, memory_mb: 1000,\n"
        "   gpus: {type: h100, count: 2, mig: [[1g.10gb, 1g.10gb, 3g.40gb], [3g.40gb, 3g.40gb]]}}\n"
        "partitions: [{name: p, nodes: [ALL], default: true}]\n")
    ctx = build_context(load_spec(tmp_path / "c.yaml"))
    # the spec's numbering, the same on both nodes: one merged row per type
    assert [(r["nodes"], r["type"], r["file"]) for r in ctx["gres_lines"]] == [
        ("g[1-2]", "1g.10gb", "/dev/nvidia-caps/nvidia-cap[0-1]"), ("g[1-2]", "3g.40gb", "/dev/nvidia-caps/nvidia-cap[2-4]")]
    lgi = "\n".join(["| GPU instances: |", *(f"|  {g}  MIG {p}  {pid}  {gi}  {s}:{n}  |" for g, p, pid, gi, s, n in [
        (0, "3g.40gb", 9, 2, 4, 4), (0, "1g.10gb", 19, 9, 0, 1), (0, "1g.10gb", 19, 10, 1, 1),
        (1, "3g.40gb", 9, 1, 0, 4), (1, "3g.40gb", 9, 2, 4, 4)])])
    g2 = next(n for n in ctx["nodes"] if n["name"] == "g2")
    rows = node_gres_lines(ctx["gres_lines"], g2, lgi, _minors(2))
    assert [(r["nodes"], r["type"], r["file"]) for r in rows] == [
        ("g1", "1g.10gb", "/dev/nvidia-caps/nvidia-cap[0-1]"), ("g2", "1g.10gb", "/dev/nvidia-caps/nvidia-cap[84,93]"),
        ("g1", "3g.40gb", "/dev/nvidia-caps/nvidia-cap[2-4]"), ("g2", "3g.40gb", "/dev/nvidia-caps/nvidia-cap[21,147,156]")]
    # a node without a MIG layout, or whose gres.conf has no File= (AutoDetect=nvml), keeps its rows
    assert node_gres_lines(ctx["gres_lines"], {**g2, "mig_layouts": None}, lgi, _minors(2)) == ctx["gres_lines"]


def test_mig_gres_cli_says_which_slice_it_cannot_number(tmp_path):
    import sys

    doc = {"gres_lines": [], "node": {"name": "g1", "mig_layouts": [["1g.10gb"]], "mig_device": "/dev/nvidia-caps/nvidia-cap{index}",
                                       "gpus": [{"type": "1g.10gb", "mig": True, "cores": None}]},
           "lgi": "| GPU instances: |\n", "minors": _minors(1)}
    proc = subprocess.run([sys.executable, "-m", "gpuhpc", "node", "mig-gres"], input=json.dumps(doc), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "node g1: GPU 0: the layout has 1 1g.10gb, nvidia-smi mig -lgi lists 0: apply the MIG layout first" in proc.stderr
