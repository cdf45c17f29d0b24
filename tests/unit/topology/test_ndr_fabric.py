"""The real multi-rail NDR DGX fabric, checked against counts taken from the file with
plain regular expressions over whole CA blocks (not the line parser)."""
import re
from collections import defaultdict

import pytest

from gpuhpc.topology import topology_from_ibnetdiscover
from gpuhpc.hostlist import expand

# a CA block's node line and its one port line, as two consecutive lines
_CA_BLOCK = re.compile(
    r'^Ca\t\d+ "H-[0-9a-f]+"\t\t# "(?P<host>\S+) (?P<hca>\S+)"\n'
    r'\[1\]\([0-9a-f]+\) \t"S-[0-9a-f]+"\[\d+\]\t\t# lid \d+ lmc \d+ "MF0;(?P<leaf>[^:"]+):',
    re.M)

RAILS = {0: ("mlx5_0", "HCA-1"), 1: ("mlx5_1", "HCA-2"), 2: ("mlx5_4", "HCA-5"), 3: ("mlx5_5", "HCA-6")}


def independent_placement(text: str, hca_names) -> dict[str, set[str]]:
    """DGX host -> leaves its HCA(s) of this rail are cabled to."""
    out: dict[str, set[str]] = defaultdict(set)
    for m in _CA_BLOCK.finditer(text):
        if "-dgx-" in m["host"] and m["hca"] in hca_names:
            out[m["host"]].add(m["leaf"])
    return out


def parse_conf(conf: str):
    leaves, spines = {}, {}
    for line in conf.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        kv = dict(part.split("=", 1) for part in line.split())
        if "Nodes" in kv:
            leaves[kv["SwitchName"]] = expand(kv["Nodes"])
        else:
            spines[kv["SwitchName"]] = expand(kv["Switches"])
    return leaves, spines


@pytest.fixture(scope="module")
def ndr_text(ndr_path):
    return ndr_path.read_text()


@pytest.mark.parametrize("rail", sorted(RAILS))
def test_every_dgx_host_once_under_its_leaf(ndr_text, rail):
    names = RAILS[rail]
    expected = independent_placement(ndr_text, names)
    assert len(expected) > 100          # hundreds of HCAs, ~120 DGX per rail
    res = topology_from_ibnetdiscover(ndr_text, source="ndr", rail=",".join(names))
    leaves, _ = parse_conf(res.text)
    seen: dict[str, list[str]] = defaultdict(list)
    for leaf, hosts in leaves.items():
        for h in hosts:
            seen[h].append(leaf)
    dgx_seen = {h: v for h, v in seen.items() if "-dgx-" in h}
    assert set(dgx_seen) == set(expected)
    for host, where in dgx_seen.items():
        assert len(where) == 1, (host, where)
        assert where[0] in expected[host]
    # the leaves are the rail's leaves: IBLEAF-<rail+1>-<group>, with a few real miscablings
    assert all(f"IBLEAF-0{rail + 1}-" in leaf for leaf in leaves if any("-dgx-" in h for h in leaves[leaf]) and
               len(leaves[leaf]) > 3)


def test_auto_picks_one_rail_and_spines_list_their_leaves(ndr_text):
    res = topology_from_ibnetdiscover(ndr_text, source="ndr")
    leaves, spines = parse_conf(res.text)
    assert len(res.tree.rails) == 1
    assert len(spines) == 9 and all("IBSPINE" in s for s in spines)
    # independent: which leaves each spine block lists on its ports
    spine_links: dict[str, set[str]] = defaultdict(set)
    for block in ndr_text.split("\n\n"):
        m = re.search(r'^Switch\t\d+ "S-[0-9a-f]+"\t\t# "MF0;([^:]+):', block, re.M)
        if m and "IBSPINE" in m[1]:
            spine_links[m[1]].update(re.findall(r'^\[\d+\]\t"S-[0-9a-f]+"\[\d+\]\t\t# "MF0;([^:]+):', block, re.M))
    for spine, kids in spines.items():
        assert set(kids) == spine_links[spine] & set(leaves)
    # every host once
    hosts = [h for v in leaves.values() for h in v]
    assert len(hosts) == len(set(hosts))


def test_rails_detected(ndr_text):
    res = topology_from_ibnetdiscover(ndr_text, source="ndr", rail="all")
    assert [sorted(r.names) for r in res.fabric.rails] == [sorted(v) for _, v in sorted(RAILS.items())]
    assert not any(r.storage for r in res.fabric.rails)
    assert any("Multiple leaf switches" in w for w in res.warnings)


def test_default_nodedesc_warnings_name_switch_and_ports(ndr_text):
    res = topology_from_ibnetdiscover(ndr_text, source="ndr")
    w = [x for x in res.warnings if "default NodeDesc" in x]
    assert any("A09-P1-IBLEAF-04-02" in x and "6, 8, 9, 13, 17" in x for x in w)


def test_cli_stdout_is_only_topology_conf(cli, ndr_path):
    rc, out, err = cli("topology", "from-ibnetdiscover", str(ndr_path))
    assert rc == 0
    assert all(l.startswith(("#", "SwitchName=")) for l in out.splitlines())
    assert "warning:" in err and "warning" not in out


def test_cli_output_file_and_json(cli, ndr_path, tmp_path):
    target = tmp_path / "etc" / "topology.conf"
    rc, out, _ = cli("topology", "from-ibnetdiscover", str(ndr_path), "-o", str(target))
    assert rc == 0 and out == ""
    assert "SwitchName=A10-P1-IBSPINE-01" in target.read_text()
    assert [p.name for p in target.parent.iterdir()] == ["topology.conf"]   # no temp files left
    rc, out, _ = cli("topology", "from-ibnetdiscover", str(ndr_path), "--json")
    import json

    data = json.loads(out)
    assert rc == 0 and len(data["rails"]) == 4 and data["topology_conf"].count("SwitchName=") == len(data["switches"])


def test_bad_rail_name(cli, ndr_path):
    rc, _, err = cli("topology", "from-ibnetdiscover", str(ndr_path), "--rail", "mlx5_9")
    assert rc == 2 and "--rail" in err and "mlx5_0" in err


def test_block_by_leaf(ndr_text):
    res = topology_from_ibnetdiscover(ndr_text, source="ndr", fmt="block", block_size=8)
    blocks = [l for l in res.text.splitlines() if l.startswith("BlockName=")]
    sizes = [l for l in res.text.splitlines() if l.startswith("BlockSizes=")]
    assert blocks and sizes == [sizes[0]] and sizes[0].startswith("BlockSizes=8,16,32")
    assert all(len(expand(b.split("Nodes=")[1])) <= 8 for b in blocks)


def test_stdin_via_subprocess_like_ansible(ndr_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "gpuhpc", "topology", "from-ibnetdiscover", "-"],
                         input=ndr_path.read_text(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert res.stdout.count("SwitchName=") == 18 and "warning" in res.stderr
    bad = subprocess.run([sys.executable, "-m", "gpuhpc", "topology", "from-ibnetdiscover", "-"],
                         input=ndr_path.read_text()[:5000], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == "" and "<stdin>:" in bad.stderr
