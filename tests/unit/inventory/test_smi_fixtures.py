"""Every real capture in the shared fixtures parses; key facts come out right."""
import json

import pytest

from gpuhpc.cli.main import main
from gpuhpc.errors import UserInputError
from gpuhpc.inventory import collect, smi
from gpuhpc.inventory.gres import build, mig_caps_minor, short_type, slurm_type


@pytest.fixture(scope="module")
def F(fixtures_dir):
    return fixtures_dir / "nvidia-smi"


def captures(folder):
    return sorted(p for p in folder.iterdir() if p.suffix != ".md")


def test_every_capture_parses(F):
    files = captures(F)
    assert len(files) >= 13
    kinds = {}
    for p in files:
        kind, res = smi.parse_any(p.read_text(), p.name)
        assert kind != "unknown", p.name
        assert res, p.name
        kinds[p.name] = kind
    assert set(kinds.values()) == {"xml", "query", "topo", "list", "lgi", "lgip", "slurmd"}


def test_dgx_a100_topo_cores_links_nics(F):
    topo = smi.parse_topo((F / "topo-m-dgx-a100.txt").read_text())
    assert [g.name for g in topo.gpus] == [f"GPU{i}" for i in range(8)]
    assert len(topo.nics) == 12
    inv = build(topo=topo, type_override="a100")
    assert len(inv.gres_lines) == 8
    # hyperthread siblings (176-191) dropped: Cores= are cores
    assert inv.gres_lines[0] == "Name=gpu Type=a100 File=/dev/nvidia0 Cores=48-63 Links=-1,12,12,12,12,12,12,12"
    assert "Cores=16-31 " in inv.gres_lines[2] and "Cores=112-127 " in inv.gres_lines[4]
    assert inv.report["gpus_per_numa"] == {"1": 2, "3": 2, "5": 2, "7": 2}
    assert inv.report["gpudirect_nics"]["GPU6"] == ["mlx5_8", "mlx5_9"]
    assert inv.report["vcpus"] == 256 and inv.report["vcpus_per_gpu"] == 32
    assert not [w for w in inv.warnings if "NIC" in w]


def test_gb200_ansi_nic_legend_empty_affinity(F):
    topo = smi.parse_topo((F / "topo-m-gb200-4gpu-ansi-sgr.txt").read_text())
    assert [n.name for n in topo.nics] == [f"mlx5_{i}" for i in range(6)]
    assert topo.gpus[2].cpus == "" and topo.gpus[2].numa == "1" and topo.gpus[0].gpu_numa == "N/A"
    inv = build(topo=topo, type_override="gb200")
    assert "Cores=0-35" in inv.gres_lines[0]          # no SMT on Grace: contiguous range kept
    assert "Cores" not in inv.gres_lines[2] and "Links=18,18,-1,18" in inv.gres_lines[2]
    w = "\n".join(inv.warnings)
    assert "GPU2: topo -m gives no CPU affinity" in w
    assert "GPU0 has no NIC under its PCIe switch" in w
    assert inv.report["vcpus"] is None


def test_dgx1_pcie_matrix(F):
    topo = smi.parse_topo((F / "topo-mp-dgx1-v100.txt").read_text())
    inv = build(topo=topo, type_override="v100", cpus=80)
    assert "Cores=0-19 " in inv.gres_lines[0] + " " and "Links" not in inv.gres_lines[0]
    assert inv.report["gpudirect_nics"]["GPU0"] == ["mlx5_0"]


def test_h100_mixed_mig_list(F):
    gpus = smi.parse_list((F / "L-h100-80gb-mig-mixed.txt").read_text())
    assert [m.profile for m in gpus[0].mig] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    inv = build(listing=gpus)
    assert inv.gres_lines[:3] == [
        "Name=gpu Type=3g.40gb Count=1  # GPU0, no device files known",
        "Name=gpu Type=2g.20gb Count=1  # GPU0, no device files known",
        "Name=gpu Type=1g.10gb Count=2  # GPU0, no device files known",
    ]
    assert inv.node_gres == "gpu:3g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb:2"
    inv = build(listing=gpus, type_style="slurm")
    assert inv.node_gres.startswith("gpu:nvidia_h100_80gb_hbm3_3g.40gb:1")


def test_legacy_uuid_and_lgi_give_device_files(F):
    gpus = smi.parse_list((F / "L-a100-40gb-mig-7x1g.5gb-legacy-uuid.txt").read_text())
    assert gpus[0].name == "A100-SXM4-40GB" and [m.gi for m in gpus[0].mig] == list(range(7, 14))
    lgi = smi.parse_mig_lgi((F / "mig-lgi-a100-40gb-7x1g.5gb.txt").read_text())
    assert [x.gi for x in lgi] == list(range(7, 14)) and lgi[0].placement == "0:1"
    inv = build(listing=gpus, lgi=lgi)
    assert inv.gres_lines[0] == ("Name=gpu Type=1g.5gb MultipleFiles=/dev/nvidia0,"
                                 "/dev/nvidia-caps/nvidia-cap66,/dev/nvidia-caps/nvidia-cap67")
    assert inv.node_gres == "gpu:1g.5gb:7"


def test_lgi_fills_gi_for_modern_uuids(F):
    gpus = smi.parse_list((F / "L-h100-80gb-mig-7x1g.10gb.txt").read_text())   # CRLF
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and len(gpus[0].mig) == 7
    lgi = [smi.GpuInstance(0, "1g.10gb", 19, gi) for gi in (7, 8, 9, 10, 11, 12, 13)]
    inv = build(listing=gpus, lgi=lgi)
    assert all("MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/" in l for l in inv.gres_lines)


def test_caps_minor_matches_slurm_autodetect(F):
    recs = smi.parse_slurmd_gres((F / "slurmd-G-h100-mig-nvml-autodetect.txt").read_text())
    assert len(recs) == 10 and recs[0]["Type"] == "nvidia_h100_80gb_hbm3"
    assert recs[2]["Type"] == "nvidia_h100_80gb_hbm3_4g.40gb" and recs[2]["Flags"].endswith("ENV_DEFAULT")
    # Slurm's MIG Index is the GI access minor of the nvidia-caps numbering
    assert {int(r["Index"]) for r in recs[2:]} <= {mig_caps_minor(g, gi) for g in range(4) for gi in range(15)}
    assert slurm_type("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert short_type("NVIDIA H100 80GB HBM3") == "h100" and short_type("A100-SXM4-40GB") == "a100"


def test_xml_mig_and_trimmed_attached(F):
    q = smi.parse_query_xml((F / "q-x-a100-sxm4-80gb-mig-4x1g-1of4gpus.xml").read_text())
    assert q.driver == "535.54.03" and len(q.gpus) == 1 and q.gpus[0].minor == 1
    assert [(m.gi, m.ci) for m in q.gpus[0].mig] == [(3, 0), (4, 0), (5, 0), (6, 0)]
    inv = build(query=q)
    assert inv.node_gres == "gpu:1g.20gb:4"
    assert inv.gres_lines[0].startswith("Name=gpu Type=1g.20gb MultipleFiles=/dev/nvidia1,")
    assert any("attached_gpus says 4" in w for w in inv.warnings)


@pytest.mark.parametrize("name,driver,first_bus", [
    ("q-text-h100-sxm-8gpu-535.183.01.txt", "535.183.01", "00000000:53:00.0"),
    ("q-text-h100-sxm-8gpu-535.161.08.txt", "535.161.08", "00000000:19:00.0"),
])
def test_query_text(F, name, driver, first_bus):
    q = smi.parse_query_text((F / name).read_text())
    assert q.driver == driver and len(q.gpus) == 8 and q.gpus[0].bus_id == first_bus
    assert [g.minor for g in q.gpus] == list(range(8)) and q.gpus[0].mig_mode == "Disabled"
    inv = build(query=q, cpus=8)
    assert inv.node_gres == "gpu:h100:8"
    assert any("1.0 per GPU" in w for w in inv.warnings)


def test_lgip_two_line_rows(F):
    rows = smi.parse_mig_lgip((F / "mig-lgip-h100-sxm5-80gb-4gpu.txt").read_text())
    assert len(rows) == 28 and {r.gpu for r in rows} == {0, 1, 2, 3}
    assert rows[6].profile == "7g.80gb" and rows[6].sms == 132 and rows[6].memory_gib == 79.25


@pytest.mark.parametrize("parser,text", [
    (smi.parse_topo, "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n"),
    (smi.parse_topo, "hello\n"),
    (smi.parse_list, "GPU 0: X (UUID: GPU-1)\nrubbish\n"),
    (smi.parse_query_xml, "<nvidia_smi_log><gpu>\n<product_name>x"),
    (smi.parse_mig_lgi, "nothing\n"),
])
def test_garbage_gives_line(parser, text):
    with pytest.raises(UserInputError) as exc:
        parser(text, "f")
    assert exc.value.field.startswith("f:")


def test_cli_files_json(F, capsys):
    rc = main(["node", "inventory", "--topo", str(F / "topo-m-dgx-a100.txt"), "--list",
               str(F / "L-a100-40gb-mig-7x1g.5gb-legacy-uuid.txt"), "--json"])
    out = capsys.readouterr()
    assert rc == 0
    data = json.loads(out.out)
    assert data["report"]["gpus"] == 1 or data["report"]["gpus"] == 8
    assert data["gres_conf"] and "warnings" in data


def test_cli_text_is_valid_gres_conf(F, capsys):
    rc = main(["node", "inventory", "--topo", str(F / "topo-m-dgx-a100.txt"), "--type", "a100", "--node", "dgx01"])
    out = capsys.readouterr().out
    assert rc == 0
    assert all(l.startswith(("NodeName=dgx01 Name=gpu", "#")) for l in out.splitlines())
    assert "# slurm.conf: NodeName=dgx01 Gres=gpu:a100:8" in out


def test_cli_bad_file(F, capsys, tmp_path):
    bad = tmp_path / "t.txt"
    bad.write_text("garbage\n")
    assert main(["node", "inventory", "--topo", str(bad)]) == 2
    assert f"{bad}:1" in capsys.readouterr().err
    assert main(["node", "inventory", "--topo", str(tmp_path / "nope")]) == 2


def test_collect_sniffs_query_text(F):
    path = F / "q-text-h100-sxm-8gpu-535.183.01.txt"
    inv = collect({"xml": (path.read_text(), str(path))}, cpus=128)
    assert len(inv.gpus) == 8 and inv.report["vcpus_per_gpu"] == 16


def test_clique_from_xml(tmp_path, F, capsys):
    xml = (F / "q-x-a100-sxm4-80gb-mig-4x1g-1of4gpus.xml").read_text()
    assert main(["node", "clique", "--smi-xml", str(F / "q-x-a100-sxm4-80gb-mig-4x1g-1of4gpus.xml")]) == 2
    assert "no NVLink clique" in capsys.readouterr().err
    # a 550+ driver adds cliqueId/clusterUuid under <fabric>
    xml = xml.replace("<gpu_reset_status>", "<fabric><state>Completed</state><status>Success</status>"
                      "<cliqueId>32766</cliqueId><clusterUuid>aaaa-bbbb</clusterUuid></fabric><gpu_reset_status>", 1)
    p = tmp_path / "q.xml"
    p.write_text(xml)
    assert main(["node", "clique", "--smi-xml", str(p), "--node", "nvl01"]) == 0
    assert capsys.readouterr().out == "nvl01 aaaa-bbbb.32766\n"


def test_live_mode_runs_nvidia_smi(F, tmp_path, monkeypatch, capsys):
    """No files given: nvidia-smi on PATH is run (here a stand-in that prints real captures)."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
case "$*" in
  "-q -x") cat {F / 'q-text-h100-sxm-8gpu-535.183.01.txt'} ;;
  "topo -m") cat {F / 'topo-m-dgx-a100.txt'} ;;
  "-L") cat {F / 'L-h100-80gb-mig-mixed.txt'} ;;
  *) echo "unexpected $*" >&2; exit 9 ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    rc = main(["node", "inventory", "--json", "--node", "n1", "--cpus", "64"])  # too few: warned
    out = capsys.readouterr()
    assert rc == 0, out.err
    data = json.loads(out.out)
    assert data["report"]["vcpus_per_gpu"] == 8 and any("--cpus 64" in w for w in data["warnings"])
    # GPU0 is in MIG mode per -L (mig -lgi failed here: no device files, a warning); GPU1 is whole
    assert data["gres_conf"][0].startswith("NodeName=n1 Name=gpu Type=3g.40gb Count=1")
    assert "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia1 Cores=48-63 Links=12,-1," in "\n".join(data["gres_conf"])


def test_live_mode_asks_the_runner_for_host_facts(F, tmp_path, monkeypatch, capsys):
    """Without --node/--cpus the host name and CPU count come through the runner too (under SSH,
    the node's, not the laptop's): here stand-ins for hostname and getconf."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("nvidia-smi", f'case "$*" in "-q -x") cat {F / "q-text-h100-sxm-8gpu-535.183.01.txt"};; '
                                      f'"topo -m") cat {F / "topo-m-dgx-a100.txt"};; "-L") echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-b4895dbf-9350-2524-a89b-98161ddd9fe4)";; esac'),
                       ("hostname", 'echo fake-node7'), ("getconf", 'echo 128')):
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    assert main(["node", "inventory", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["report"]["vcpus"] == 128 and data["gres_conf"][0].startswith("NodeName=fake-node7 ")


def test_live_mode_without_nvidia_smi_is_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["node", "inventory"]) == 2
    assert "nvidia-smi not found" in capsys.readouterr().err


def test_live_fetch_through_a_remote_runner():
    """An SSH runner reports a missing command as exit 127 (the remote shell's), not as an exception."""
    from gpuhpc.cli.node import _live
    from gpuhpc.transport import CommandResult

    class Remote:
        def run(self, argv, *, input=None, timeout=None, env=None):
            return CommandResult(tuple(argv), 127, "", "bash: nvidia-smi: command not found")

    with pytest.raises(UserInputError, match="nvidia-smi not found"):
        _live(Remote())
