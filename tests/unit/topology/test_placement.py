"""Leaves from scontrol show topology, the fewest leaves for n nodes, a job's placement."""
from gpuhpc.topology.placement import fewest_leaves, leaf_nodes, placement, worst_spread

TOPO = [{"SwitchName": "leaf1", "Level": "0", "LinkSpeed": "1", "Nodes": "gpu-node1,mig-node1"},
        {"SwitchName": "leaf2", "Level": "0", "LinkSpeed": "1", "Nodes": "gpu-node2,cpu-node1"},
        {"SwitchName": "spine", "Level": "1", "Nodes": "cpu-node1,gpu-node[1-2],mig-node1", "Switches": "leaf[1-2]"}]


def test_leaf_nodes_and_fewest():
    leaves = leaf_nodes(TOPO)
    assert leaves == {"leaf1": {"gpu-node1", "mig-node1"}, "leaf2": {"gpu-node2", "cpu-node1"}}
    assert fewest_leaves(leaves, 2) == 1
    assert fewest_leaves(leaves, 3) == 2
    assert fewest_leaves(leaves, 2, ["gpu-node1", "gpu-node2"]) == 2      # partition gpu: one node per leaf
    assert fewest_leaves({}, 2) == 0 and fewest_leaves(leaves, 5) == 0


def test_placement_summary():
    leaves = leaf_nodes(TOPO)
    assert placement(leaves, ["gpu-node1", "mig-node1"]).summary() == "1 leaf (best 1)"
    p = placement(leaves, ["gpu-node1", "gpu-node2"])
    assert p.spread and p.summary() == "spread: 2 leaves (best 1)"
    p = placement(leaves, ["gpu-node1", "gpu-node2"], ["gpu-node1", "gpu-node2"])
    assert not p.spread and p.summary() == "2 leaves (best 2)"
    assert placement(leaves, ["gpu-node1", "x9"]).unplaced == ("x9",)


def test_worst_spread_ranks_extra_leaves_then_gpu_hours():
    leaves = leaf_nodes(TOPO)
    parts = {"all": ["gpu-node1", "gpu-node2", "mig-node1", "cpu-node1"], "gpu": ["gpu-node1", "gpu-node2"]}
    jobs = [{"job_id": "1", "partition": "all", "nodes": ["gpu-node1", "mig-node1"], "gpu_hours": 9},
            {"job_id": "2", "partition": "all", "nodes": ["gpu-node1", "gpu-node2"], "gpu_hours": 1},
            {"job_id": "3", "partition": "all", "nodes": ["mig-node1", "cpu-node1"], "gpu_hours": 5},
            {"job_id": "4", "partition": "gpu", "nodes": ["gpu-node1", "gpu-node2"], "gpu_hours": 50},
            {"job_id": "5", "partition": "all", "nodes": ["gpu-node1"], "gpu_hours": 70}]
    assert [(r["job_id"], r["extra_leaves"]) for r in worst_spread(jobs, leaves, parts)] == [("3", 1), ("2", 1)]


def test_nvlink_domains_from_features_else_blocks_and_in_the_placement():
    from gpuhpc.topology.placement import nvlink_domains, nvlink_feature

    feats = {"gpu-node1": ("h100", nvlink_feature("nvl1")), "mig-node1": ("nvl-nvl1",),
             "gpu-node2": ("nvl-nvl2",), "cpu-node1": ()}
    domains = nvlink_domains(feats, [{"BlockName": "b1", "Nodes": "cpu-node1"}])
    assert domains == {"nvl1": {"gpu-node1", "mig-node1"}, "nvl2": {"gpu-node2"}}        # features win
    assert nvlink_domains({}, [{"BlockName": "b1", "BlockIndex": "0", "Nodes": "gpu-node[1-2]"}]) == \
        {"b1": {"gpu-node1", "gpu-node2"}}                                                 # topology/block (23.11+)
    leaves = leaf_nodes(TOPO)
    p = placement(leaves, ["gpu-node1", "mig-node1"], domains=domains)
    assert p.summary() == "1 leaf (best 1); 1 NVLink domain (best 1)" and not p.domain_spread
    p = placement(leaves, ["gpu-node1", "gpu-node2"], domains=domains)
    assert p.domain_spread and p.summary() == "spread: 2 leaves (best 1); spread: 2 NVLink domains (best 1)"
    assert p.to_dict()["nvlink_domains"] == ["nvl1", "nvl2"] and p.to_dict()["best_nvlink_domains"] == 1
    p = placement({}, ["gpu-node1", "gpu-node2"], domains=domains)
    assert p.summary() == "spread: 2 NVLink domains (best 1)"
    assert placement(leaves, ["gpu-node1"]).to_dict()["nvlink_domains"] == []              # none known


def test_job_placement_reports_nvlink_domains_from_node_features():
    from types import SimpleNamespace as NS

    from gpuhpc.cli.placement import job_placement

    class Client:
        def show_job(self, job_id):
            return {"NodeList": "gpu-node[1-2]", "Partition": "all"}

        def topology(self):
            return TOPO

        def nodes(self):
            return [NS(name="gpu-node1", features=("h100", "nvl-a")), NS(name="mig-node1", features=("nvl-a",)),
                    NS(name="gpu-node2", features=("h100", "nvl-b")), NS(name="cpu-node1", features=())]

        def partitions(self):
            return [NS(name="all", nodes="cpu-node1,gpu-node[1-2],mig-node1")]

    got = job_placement("7", client=Client())
    assert got["nvlink_domains"] == ["a", "b"] and got["nvlink_spread"]
    assert got["summary"] == "spread: 2 leaves (best 1); spread: 2 NVLink domains (best 1)"


def test_nvlink_domains_become_node_features_in_slurm_conf(tmp_path):
    """The 22.05 way (no topology/block before 23.11): each node of a spec's NVLink domain gets
    the feature nvl-<domain>, which `gpuhpc placement` reads and --constraint=[nvl-a|nvl-b] uses."""
    from pathlib import Path

    import yaml

    from gpuhpc.conf.context import build_context
    from gpuhpc.spec.cluster import load_spec

    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples/clusters/local.yaml").read_text())
    gpu = next(g for g in data["node_groups"] if g["name"] == "gpu")
    gpu["nvlink_domain_size"] = 1
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    lines = {r["nodes"]: r["features"] for r in build_context(load_spec(tmp_path / "c.yaml"))["node_lines"]}
    assert lines["gpu-node1"].split(",")[-1] == "nvl-gpu-nvl1" and lines["gpu-node2"].endswith(",nvl-gpu-nvl2")
    assert "nvl-" not in (lines.get("mig-node1") or "")


def test_block_topology_only_for_a_slurm_release_that_has_it(tmp_path):
    """topology.plugin: block renders one BlockName= per NVLink domain for Slurm 23.11+ (24.11 in
    the lab); for 22.05 it is refused naming the field (the domains stay node features)."""
    from pathlib import Path

    import pytest
    import yaml

    from gpuhpc.conf.context import build_context
    from gpuhpc.conf.render import render_context
    from gpuhpc.errors import UserInputError
    from gpuhpc.spec.cluster import load_spec

    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples/clusters/local.yaml").read_text())
    next(g for g in data["node_groups"] if g["name"] == "gpu")["nvlink_domain"] = "nvl72a"
    data["topology"] = {"plugin": "block"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    spec = load_spec(tmp_path / "c.yaml")
    ctx = build_context(spec, slurm_version="24.11")
    assert ctx["topology_plugin"] == "topology/block"
    assert ctx["nvlink_blocks"] == [{"name": "nvl72a", "nodes": "gpu-node[1-2]"}]
    text = render_context(ctx)["topology.conf"]
    assert "BlockName=nvl72a Nodes=gpu-node[1-2]" in text and "SwitchName" not in text
    with pytest.raises(UserInputError) as exc:
        build_context(spec, slurm_version="22.05")
    assert exc.value.field == "topology.plugin" and "23.11" in str(exc.value)
    tree = build_context(load_spec(Path(__file__).resolve().parents[3] / "examples/clusters/local.yaml"))
    assert tree["nvlink_blocks"] == [] and "SwitchName=leaf1" in render_context(tree)["topology.conf"]
