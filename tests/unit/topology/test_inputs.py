"""Bad input, odd fabrics, synthetic round trips, spec and block options."""
import re

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import expand
from gpuhpc.topology import parse, topology_from_ibnetdiscover
from gpuhpc.topology.synth import synth


def conf_map(text):
    leaves, spines = {}, {}
    for line in text.splitlines():
        if line.startswith("SwitchName="):
            kv = dict(p.split("=", 1) for p in line.split())
            (leaves if "Nodes" in kv else spines)[kv["SwitchName"]] = expand(kv.get("Nodes") or kv["Switches"])
    return leaves, spines


def test_single_hca_warns_not_crashes(cli, fixtures_dir):
    rc, out, err = cli("topology", "from-ibnetdiscover", str(fixtures_dir / "ibnetdiscover" / "single-hca-no-switch.out"))
    assert rc == 0
    assert "no switches" in err and "dgx-gb200-n01-c1" in err
    assert "SwitchName" not in out


@pytest.mark.parametrize("payload,line", [
    ("garbage\n", 1),
    ("vendid=0x2c9\nhello world\n", 2),
    ("#\n\nSwitch 65 \"S-zz\"\n", 3),
])
def test_garbage_exit_2_with_line(cli, tmp_path, payload, line):
    f = tmp_path / "bad.out"
    f.write_text(payload)
    rc, out, err = cli("topology", "from-ibnetdiscover", str(f))
    assert rc == 2 and out == ""
    assert f"{f}:{line}:" in err


def test_binary_and_empty(cli, tmp_path):
    f = tmp_path / "bin.out"
    f.write_bytes(b"vendid=0x2c9\n\xff\xfe\x00\x01")
    rc, _, err = cli("topology", "from-ibnetdiscover", str(f))
    assert rc == 2 and f"{f}:2" in err
    f.write_text("")
    rc, _, err = cli("topology", "from-ibnetdiscover", str(f))
    assert rc == 2 and "no Switch or Ca" in err


def test_truncated_mid_line(ndr_path):
    data = ndr_path.read_text()
    cut = data[: len(data) // 2]
    cut = cut[: cut.rindex('"H-') + 9]          # inside a port line's GUID
    lineno = cut.count("\n") + 1
    with pytest.raises(UserInputError) as exc:
        parse(cut, "ndr")
    assert exc.value.field == f"ndr:{lineno}"


def test_truncated_at_line_boundary(ndr_path):
    lines = ndr_path.read_text().splitlines(keepends=True)
    # stop inside a switch block (after its 3rd port line): the rest of the fabric is missing
    idx = next(i for i, l in enumerate(lines) if l.startswith("Switch") and i > 1000) + 4
    with pytest.raises(UserInputError) as exc:
        parse("".join(lines[:idx]), "ndr")
    assert re.fullmatch(r"ndr:\d+", exc.value.field)
    assert "truncated" in str(exc.value)


@pytest.mark.parametrize("levels", [2, 3])
def test_synth_round_trip(levels):
    text = synth(levels=levels, leaves=6, hosts_per_leaf=5, leaves_per_pod=2)
    res = topology_from_ibnetdiscover(text, source="synth")
    leaves, spines = conf_map(res.text)
    assert len(leaves) == 6 and all(len(v) == 5 for v in leaves.values())
    assert sorted(h for v in leaves.values() for h in v) == [f"gpu{i:03d}" for i in range(1, 31)]
    top = max(s.level for s in res.tree.switches)
    assert top == levels - 1
    assert not [w for w in res.warnings if "no switch reaches" in w]


def test_synth_multi_plane_rails(cli, tmp_path):
    dump = tmp_path / "f.out"
    rc, _, _ = cli("topology", "synth", "--levels", "2", "--leaves", "3", "--hosts-per-leaf", "4", "--rails", "2",
                   "-o", str(dump))
    assert rc == 0
    res = topology_from_ibnetdiscover(dump.read_text(), source="f")
    assert res.fabric.planes and len(res.fabric.rails) == 2
    leaves, _ = conf_map(res.text)
    assert all(name.startswith("r0-") for name in leaves)
    res1 = topology_from_ibnetdiscover(dump.read_text(), source="f", rail="mlx5_1")
    leaves1, _ = conf_map(res1.text)
    assert all(name.startswith("r1-") for name in leaves1)
    assert sorted(sum(leaves.values(), [])) == sorted(sum(leaves1.values(), []))


def test_degraded_link_names_switch_port_and_host():
    text = synth(levels=2, leaves=2, hosts_per_leaf=3, degraded=1)
    res = topology_from_ibnetdiscover(text, source="s")
    deg = [w for w in res.warnings if w.startswith("degraded link")]
    assert len(deg) == 1
    assert "switch r0-leaf001 port 1" in deg[0] and "host gpu001 (mlx5_0)" in deg[0] and "2xNDR" in deg[0]


def test_spec_hosts(tmp_path, cli, write_spec):
    dump = tmp_path / "f.out"
    dump.write_text(synth(levels=2, leaves=2, hosts_per_leaf=2, hosts=["gpu1", "gpu2", "gpu3", "ufm1"]))
    spec = write_spec({"name": "gpu", "hostname": "gpu{n}", "count": 4})
    rc, out, err = cli("topology", "from-ibnetdiscover", str(dump), "--spec", str(spec))
    assert rc == 0
    assert "not in the spec" in err and "ufm1" in err
    assert "not in the fabric" in err and "gpu4" in err
    assert "ufm1" not in out and "Nodes=gpu[1-2]" in out


def test_spec_bad_yaml(tmp_path, cli):
    dump = tmp_path / "f.out"
    dump.write_text(synth(levels=2, leaves=1, hosts_per_leaf=1))
    spec = tmp_path / "cluster.yaml"
    spec.write_text("node_groups: [\n  {a: 1\n")
    rc, _, err = cli("topology", "from-ibnetdiscover", str(dump), "--spec", str(spec))
    assert rc == 2 and "cluster.yaml is not valid YAML" in err


def test_spec_is_validated_like_conf_validate(tmp_path, cli, write_spec):
    dump = tmp_path / "f.out"
    dump.write_text(synth(levels=2, leaves=1, hosts_per_leaf=2, host_prefix="nvl"))
    spec = write_spec({"name": "gb200", "hostname": "nvl{n:03d}", "count": 2, "nvlink_domains": ["nvl[001-003]"]})
    rc, _, err = cli("topology", "from-ibnetdiscover", str(dump), "--spec", str(spec), "--format", "block",
                     "--block-by", "nvlink")
    assert rc == 2 and "node_groups[0].nvlink_domains[0]: 'nvl003' is not a node of this group" in err
    assert cli("conf", "validate", str(spec))[0] == 2


def test_block_by_nvlink_cliques(tmp_path, cli):
    dump = tmp_path / "f.out"
    dump.write_text(synth(levels=2, leaves=2, hosts_per_leaf=4))
    cl = tmp_path / "cliques"
    cl.write_text("".join(f"gpu{i:03d} {'A' if i <= 6 else 'B'}.1\n" for i in range(1, 9)))
    rc, out, err = cli("topology", "from-ibnetdiscover", str(dump), "--format", "block", "--block-by", "nvlink",
                       "--cliques", str(cl))
    assert rc == 0
    assert "BlockName=b1 Nodes=gpu[001-006]" in out and "BlockName=b2 Nodes=gpu[007-008]" in out
    assert "BlockSizes=2,4,8" in out
    rc, _, err = cli("topology", "from-ibnetdiscover", str(dump), "--format", "block", "--block-by", "nvlink")
    assert rc == 2 and "--cliques" in err


HAND = """\
vendid=0x2c9
devid=0xd2f2
sysimgguid=0x0000000000000001
switchguid=0x0000000000000001(0000000000000001)
Switch\t41 "S-0000000000000001"\t\t# "MF0;leaf-a:MQM8790/U1" enhanced port 0 lid 1 lmc 0
[1]\t"H-00000000000000a1"[1](00000000000000a1) \t\t# "gpu001 HCA-1" lid 11 4xHDR
[2]\t"H-00000000000000a2"[1](00000000000000a2) \t\t# "gpu002 HCA-1" lid 12 4xHDR
[40]\t"S-0000000000000003"[1]\t\t# "MF0;spine-1:MQM8790/U1" lid 3 4xHDR

vendid=0x2c9
devid=0xd2f2
sysimgguid=0x0000000000000002
switchguid=0x0000000000000002(0000000000000002)
Switch\t41 "S-0000000000000002"\t\t# "MF0;leaf-b:MQM8790/U1" enhanced port 0 lid 2 lmc 0
[1]\t"H-00000000000000b1"[1](00000000000000b1) \t\t# "MT4123 ConnectX6   Mellanox Technologies" lid 21 4xHDR
[40]\t"S-0000000000000003"[2]\t\t# "MF0;spine-1:MQM8790/U1" lid 3 2xHDR

vendid=0x2c9
devid=0xd2f2
sysimgguid=0x0000000000000003
switchguid=0x0000000000000003(0000000000000003)
Switch\t41 "S-0000000000000003"\t\t# "MF0;spine-1:MQM8790/U1" enhanced port 0 lid 3 lmc 0
[1]\t"S-0000000000000001"[40]\t\t# "MF0;leaf-a:MQM8790/U1" lid 1 4xHDR
[2]\t"S-0000000000000002"[40]\t\t# "MF0;leaf-b:MQM8790/U1" lid 2 2xHDR

vendid=0x2c9
devid=0x101b
sysimgguid=0x00000000000000a1
caguid=0x00000000000000a1
Ca\t1 "H-00000000000000a1"\t\t# "gpu001 HCA-1"
[1](00000000000000a1) \t"S-0000000000000001"[1]\t\t# lid 11 lmc 0 "MF0;leaf-a:MQM8790/U1" lid 1 4xHDR

vendid=0x2c9
devid=0x101b
sysimgguid=0x00000000000000a2
caguid=0x00000000000000a2
Ca\t1 "H-00000000000000a2"\t\t# "gpu002 HCA-1"
[1](00000000000000a2) \t"S-0000000000000001"[2]\t\t# lid 12 lmc 0 "MF0;leaf-a:MQM8790/U1" lid 1 4xHDR

vendid=0x2c9
devid=0x101b
sysimgguid=0x00000000000000b1
caguid=0x00000000000000b1
Ca\t1 "H-00000000000000b1"\t\t# "MT4123 ConnectX6   Mellanox Technologies"
[1](00000000000000b1) \t"S-0000000000000002"[1]\t\t# lid 21 lmc 0 "MF0;leaf-b:MQM8790/U1" lid 2 4xHDR
"""


def test_hand_written_fabric_warnings():
    res = topology_from_ibnetdiscover(HAND, source="hand")
    leaves, spines = conf_map(res.text)
    assert leaves == {"leaf-a": ["gpu001", "gpu002"]} and spines == {"spine-1": ["leaf-a"]}
    text = "\n".join(res.warnings)
    assert "switch leaf-b: 1 CA(s) with a default NodeDesc" in text and "port(s) 1" in text
    assert "switch leaf-b has no hosts" in text
    assert "degraded link: switch leaf-b port 40 <-> switch spine-1 port 2 runs at 2xHDR" in text


def test_host_names_from_descriptions():
    from gpuhpc.topology.fabric import split_desc

    assert split_desc("gpu001 HCA-1") == ("gpu001", "HCA-1")
    assert split_desc("a08-p1-dgx-04-c01 mlx5_5") == ("a08-p1-dgx-04-c01", "mlx5_5")
    assert split_desc("node7") == ("node7", "")
    assert split_desc("MT4129 ConnectX7   Mellanox Technologies") is None
    assert split_desc("Mellanox Technologies Aggregation Node") is None


def test_local_fabric_matches_local_spec(repo_root, cli):
    rc, out, err = cli("topology", "from-ibnetdiscover",
                       str(repo_root / "tests" / "integration" / "topology" / "local-fabric.out"),
                       "--spec", str(repo_root / "examples" / "clusters" / "local.yaml"))
    assert rc == 0 and "spec" not in err
    assert "SwitchName=r0-leaf001 Nodes=gpu-node[1-2]" in out


def test_storage_plane_is_not_picked_by_auto():
    compute = synth(levels=2, leaves=2, hosts_per_leaf=4, spines=2)
    storage_hosts = [f"gpu{i:03d}" for i in range(1, 9)] + [f"stor{i:02d}" for i in range(1, 13)]
    storage = synth(levels=2, leaves=4, hosts_per_leaf=5, spines=2, hosts=storage_hosts, host_prefix="s")
    storage = (storage.replace("mlx5_0", "mlx5_7").replace("9803e103", "9803e104").replace("e8ebd303", "e8ebd304")
               .replace("r0-", "stor-"))
    res = topology_from_ibnetdiscover(compute + storage, source="two-planes")
    assert res.fabric.planes and len(res.fabric.rails) == 2
    storage_rail = next(r for r in res.fabric.rails if "mlx5_7" in r.names)
    assert storage_rail.storage and len(storage_rail.hosts) > len(res.fabric.rails[0].hosts)
    assert [r.names for r in res.tree.rails] == [{"mlx5_0"}]
    leaves, _ = conf_map(res.text)
    assert sorted(sum(leaves.values(), [])) == [f"gpu{i:03d}" for i in range(1, 9)]
    assert "storage/mgmt?" in res.warnings[0]
    # the admin can still ask for it explicitly
    res = topology_from_ibnetdiscover(compute + storage, source="two-planes", rail="mlx5_7")
    leaves, _ = conf_map(res.text)
    assert len(sum(leaves.values(), [])) == 20


def test_block_by_nvlink_domains_from_spec(tmp_path, cli, write_spec):
    dump = tmp_path / "f.out"
    dump.write_text(synth(levels=2, leaves=3, hosts_per_leaf=6, host_prefix="nvl"))
    spec = write_spec({"name": "gb200", "hostname": "nvl{n:03d}", "count": 18, "nvlink_domain_size": 9})
    assert cli("conf", "validate", str(spec))[0] == 0          # the spec --block-by nvlink needs is a valid one
    rc, out, err = cli("topology", "from-ibnetdiscover", str(dump), "--spec", str(spec), "--format", "block",
                       "--block-by", "nvlink")
    assert rc == 0, err
    assert "BlockName=b1 Nodes=nvl[001-009]" in out and "BlockName=b2 Nodes=nvl[010-018]" in out
    assert "BlockSizes=9,18" in out


def test_fabric_without_host_names_warns():
    text = HAND.replace('"gpu001 HCA-1"', '"MT4123 ConnectX6   Mellanox Technologies"').replace(
        '"gpu002 HCA-1"', '"MT4123 ConnectX6   Mellanox Technologies"')
    res = topology_from_ibnetdiscover(text, source="x")
    assert "SwitchName" not in res.text
    assert any(w.startswith("no host names in this fabric (3 switches, 3 CAs") for w in res.warnings)


def test_spec_format_validates_against_the_spec_model(repo_root, cli):
    import yaml

    from gpuhpc.spec.cluster import Topology

    rc, out, err = cli("topology", "from-ibnetdiscover",
                       str(repo_root / "tests" / "integration" / "topology" / "local-fabric.out"), "--format", "spec")
    assert rc == 0, err
    topo = Topology(**yaml.safe_load(out)["topology"])
    assert [(s.name, s.nodes, s.switches) for s in topo.switches] == [
        ("r0-leaf001", ["gpu-node[1-2]"], []), ("r0-leaf002", ["cpu-node1", "mig-node1"], []),
        ("r0-spine001", [], ["r0-leaf001", "r0-leaf002"])]


def test_spec_ib_hcas_exclude_storage_plane_from_auto(tmp_path, cli, write_spec):
    # two planes with the same hosts: mlx5_0 (compute) and mlx5_1 (storage, bigger leaves)
    text = synth(levels=2, leaves=2, hosts_per_leaf=3, rails=2)
    dump = tmp_path / "f.out"
    dump.write_text(text)
    spec = write_spec({"name": "g", "hostname": "gpu{n:03d}", "count": 6, "ib_hcas": ["mlx5_1"]})
    rc, out, err = cli("topology", "from-ibnetdiscover", str(dump), "--spec", str(spec), "--rail", "all")
    assert rc == 0, err
    assert "SwitchName=r1-leaf001" in out and "r0-leaf" not in out
    assert "no HCA from the spec's ib_hcas" in err
