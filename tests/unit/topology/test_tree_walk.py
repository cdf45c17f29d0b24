"""build_tree's parts: the graph walk returns facts (no text); the warnings are worded apart."""
from __future__ import annotations

from gpuhpc.topology import analyse, parse
from gpuhpc.topology.fabric import left_out_switches, pick_rails, place_hosts, reaches_all, switch_levels, tree_switches
from gpuhpc.topology.synth import synth


def _walk(text, spec=None):
    fab = analyse(parse(text, "t"))
    chosen, names = pick_rails(fab, "auto")
    placement = place_hosts(fab, chosen, names, spec)
    level, children = switch_levels(fab, placement.leaf_hosts)
    return fab, placement, level, children


def test_three_level_walk():
    fab, placement, level, children = _walk(synth(levels=3, leaves=4, hosts_per_leaf=2, leaves_per_pod=2))
    names = {sid: fab.names[sid] for sid in level}
    assert sorted(level.values()).count(0) == 4 and max(level.values()) == 2
    switches = tree_switches(fab, level, children, placement.leaf_hosts)
    assert [s.level for s in switches] == sorted(s.level for s in switches)
    assert sum(len(s.nodes) for s in switches) == 8 and set(placement.placed) == {f"gpu{i:03d}" for i in range(1, 9)}
    assert reaches_all(switches, set(placement.placed))
    assert all(isinstance(n, str) for n in names.values()) and placement.multi_leaf == []


def test_spec_filter_and_left_out_switch_are_facts():
    fab, placement, level, _ = _walk(synth(levels=2, leaves=2, hosts_per_leaf=2), spec={"gpu001", "gpu002"})
    assert set(placement.placed) == {"gpu001", "gpu002"}
    left = left_out_switches(fab, level, placement.leaf_hosts, {"gpu001", "gpu002"})
    assert [(fab.names[sid], why) for sid, why in left] == [("r0-leaf002", "not-in-spec")]


def test_reaches_all_sees_a_split():
    from gpuhpc.topology.fabric import TreeSwitch

    split = [TreeSwitch("a", "leaf-a", 0, nodes=["n1"]), TreeSwitch("b", "leaf-b", 0, nodes=["n2"])]
    assert not reaches_all(split, {"n1", "n2"}) and reaches_all([], set())
