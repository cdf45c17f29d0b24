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
