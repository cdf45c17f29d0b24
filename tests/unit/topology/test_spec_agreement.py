"""slurm.conf (``gpuhpc conf render``) and topology.conf (``gpuhpc topology from-ibnetdiscover
--spec``) written from the same cluster spec name the same nodes: every example spec, and a
GB200-style spec whose NVLink domains (``nvlink_domain_size``) drive topology/block."""
from __future__ import annotations

import math
import re

import pytest

from gpuhpc.conf.render import render_spec
from gpuhpc.hostlist import expand
from gpuhpc.spec.cluster import load_spec, spec_from_data
from gpuhpc.topology import topology_from_ibnetdiscover
from gpuhpc.topology.spec import from_spec
from gpuhpc.topology.synth import synth

GB200 = {
    "name": "nvl", "controller": {"hosts": ["ctl"]},
    "node_groups": [{"name": "gb200", "hostname": "gb200-r{n:02d}", "count": 36, "sockets": 2,
                     "cores_per_socket": 72, "memory_mb": 960000, "nvlink_domain_size": 18,
                     "gpus": {"type": "gb200", "count": 4}},
                    {"name": "login", "hostname": "login{n}", "count": 2, "sockets": 1, "cores_per_socket": 32,
                     "memory_mb": 256000}],
    "partitions": [{"name": "all", "nodes": ["ALL"], "default": True}],
}


def _node_names(conf: str, key: str) -> list[str]:
    """Every node a slurm.conf/topology.conf names in ``key=`` (NodeName, Nodes), expanded."""
    out: list[str] = []
    for line in conf.splitlines():
        m = re.match(rf"^(?:\w+=\S+\s+)*?{key}=(\S+)", line.split("#", 1)[0].strip())
        if m and m.group(1) not in ("ALL", "DEFAULT"):
            out += expand(m.group(1))
    return out


def _specs(repo_root):
    specs = [(p.name, load_spec(p)) for p in sorted((repo_root / "examples" / "clusters").glob("*.yaml"))]
    return specs + [("gb200", spec_from_data(GB200))]


def test_slurm_conf_and_topology_conf_agree_on_node_names(repo_root):
    for label, spec in _specs(repo_root):
        files, _ = render_spec(spec, storage_pass="x")
        slurm_nodes = _node_names(files["slurm.conf"], "NodeName")
        nodes = from_spec(spec)
        assert slurm_nodes == nodes.hosts, label
        # a fabric cabling exactly those hosts, 4 per leaf (the last leaf padded with one stranger)
        per_leaf = 4
        leaves = math.ceil(len(slurm_nodes) / per_leaf)
        hosts = slurm_nodes + [f"stranger{i}" for i in range(leaves * per_leaf - len(slurm_nodes))]
        dump = synth(levels=2, leaves=leaves, hosts_per_leaf=per_leaf, hosts=hosts)
        tree = topology_from_ibnetdiscover(dump, source=label, spec_hosts=nodes.hosts)
        assert sorted(_node_names(tree.text, "Nodes")) == sorted(slurm_nodes), label
        if "topology.conf" in files:     # the spec's own topology: section, rendered by conf render
            assert set(_node_names(files["topology.conf"], "Nodes")) <= set(slurm_nodes), label
        if nodes.domains:
            block = topology_from_ibnetdiscover(dump, source=label, spec_hosts=nodes.hosts, fmt="block",
                                                block_by="nvlink", domains=nodes.domains)
            in_blocks = _node_names(block.text, "Nodes")
            assert sorted(in_blocks) == sorted(nodes.domains) and set(in_blocks) <= set(slurm_nodes), label


def test_gb200_domains_come_from_the_model():
    nodes = from_spec(spec_from_data(GB200))
    assert nodes.domains["gb200-r01"] == nodes.domains["gb200-r18"] == "gb200-nvl1"
    assert nodes.domains["gb200-r19"] == "gb200-nvl2" and "login1" not in nodes.domains


@pytest.mark.parametrize(("fields", "message"), [
    ({"nvlink_domain": "a", "nvlink_domain_size": 18}, "give one of nvlink_domain, nvlink_domain_size"),
    ({"nvlink_domain_size": 0}, "greater than or equal to 1"),
    ({"nvlink_domains": ["gb200-r[01-18] x"]}, "may only contain"),
])
def test_nvlink_fields_are_validated(fields, message):
    from gpuhpc.errors import SpecError

    data = {**GB200, "node_groups": [{**GB200["node_groups"][0], "nvlink_domain_size": None, **fields}]}
    with pytest.raises(SpecError, match=message) as exc:
        spec_from_data(data)
    assert exc.value.field.startswith("node_groups[0]")


def test_nvlink_domains_cross_checks():
    from gpuhpc.conf.validate import validate
    from gpuhpc.errors import SpecError

    group = {**GB200["node_groups"][0], "nvlink_domain_size": None}
    ok = spec_from_data({**GB200, "node_groups": [{**group, "nvlink_domains": ["gb200-r[01-18]", "gb200-r[19-30]"]}]})
    assert any("gb200-r[31-36] in no NVLink domain" in w for w in validate(ok))
    assert from_spec(ok).domains["gb200-r19"] == "gb200-nvl2"
    twice = spec_from_data({**GB200, "node_groups": [{**group, "nvlink_domains": ["gb200-r[01-18]", "gb200-r18"]}]})
    with pytest.raises(SpecError, match="already in nvlink_domains"):
        validate(twice)
    odd = spec_from_data({**GB200, "node_groups": [{**group, "nvlink_domain_size": 10}]})
    assert any("the last domain has 6 node(s)" in w for w in validate(odd))
