"""Per-trial resources: a sweep's ``resources_by`` (the hook a sprint's GPUs-per-node / nodes /
placement axes use) and the sprint's shapes: each configuration its own Slurm request."""
from __future__ import annotations

import json
import pathlib

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps import planner
from gpuhpc.sweeps.spec import SweepSpec, spec_from_json, spec_json

BASE = {"name": "s", "command": "run --bs {bs}", "method": "grid", "template": "mpi", "metric": {"name": "thr", "goal": "maximize"},
        "parameters": {"bs": [1, 2], "nodes": [1, 2]}, "resources": {"partition": "all", "time": "2m"}}


def _spec(**kw) -> SweepSpec:
    return SweepSpec.from_mapping({**BASE, **kw})


def test_resources_by_updates_each_trial_and_survives_the_json_round_trip():
    spec = _spec(resources_by=[{"when": {"nodes": 2}, "resources": {"nodes": 2, "gpus": 4}}])
    assert spec.resources_for({"bs": 1, "nodes": 1}) == {"partition": "all", "time": "2m"}
    assert spec.resources_for({"bs": 1, "nodes": 2}) == {"partition": "all", "time": "2m", "nodes": 2, "gpus": 4}
    again = spec_from_json(spec_json(spec))
    assert again.resources_for({"bs": 2, "nodes": 2})["gpus"] == 4


def test_trials_of_one_shape_share_an_array_and_each_array_gets_its_resources():
    spec = _spec(resources_by=[{"when": {"nodes": n}, "resources": {"nodes": n}} for n in (1, 2)])
    waiting = [(i, json.dumps(p)) for i, p in enumerate(spec.generate())]
    groups, res = planner.shape_groups(spec, waiting, 51)
    assert [[n for n, _ in g] for g in groups] == [[0, 2], [1, 3]]
    assert [(r.nodes, t) for r, t in res] == [(1, "mpi"), (2, "mpi")]
    job = planner.trial_spec(spec, 1, pathlib.Path("/x"), 0, 2, 2, res=res[1][0], template="torchrun")
    assert job.resources.nodes == 2 and job.resources.partition == "all" and job.template == "torchrun"
    groups, res = planner.shape_groups(spec, waiting, 1)            # chunks still cut at the array size
    assert len(groups) == 4 and [r.nodes for r, _ in res] == [1, 1, 2, 2]
    plain = _spec()
    groups, res = planner.shape_groups(plain, waiting, 3)
    assert [len(g) for g in groups] == [3, 1] and res == [None, None]


@pytest.mark.parametrize("rules, field", [
    ("x", "resources_by"),
    ([{"when": {"lr": 1}, "resources": {}}], "resources_by[0].when.lr"),
    ([{"when": {}, "resources": {"gpus": -1}}], "resources_by[0].resources.gpus"),
    ([{"when": {}, "resources": {"array": "0-3"}}], "resources_by[0].resources.array"),
    ([{"if": {}}], "resources_by[0].if"),
    ([{"when": {}, "template": "slurm"}], "resources_by[0].template"),
])
def test_bad_resources_by_names_the_field(rules, field):
    with pytest.raises(UserInputError) as exc:
        _spec(resources_by=rules)
    assert exc.value.field == field


# ---------------------------------------------------------------- the sprint's shapes
class Node:
    def __init__(self, name, gpus, partitions=("all",)):
        self.name, self.gpus_total, self.partitions = name, ({"h100": gpus} if gpus else {}), partitions


LEAVES = {"leaf1": {"gpu-node1", "mig-node1"}, "leaf2": {"gpu-node2", "cpu-node1"}}
NODES = [Node("gpu-node1", 8), Node("mig-node1", 9), Node("gpu-node2", 8), Node("cpu-node1", 0)]


def test_each_configuration_is_its_own_request():
    from gpuhpc.sprints.shapes import shape

    assert shape({"gpus_per_node": 4, "nodes": 1, "placement": "spread"}) == {"nodes": 1, "gpus": 4}
    assert shape({"gpus_per_node": 4, "nodes": 2, "placement": "one-leaf"}) == {"nodes": 2, "gpus": 4}   # no tree
    got = shape({"gpus_per_node": 4, "nodes": 2, "placement": "one-leaf"}, leaves=LEAVES, nodes=NODES, partition="all")
    assert got == {"nodes": 2, "gpus": 4, "nodelist": "gpu-node1,mig-node1", "switches": "1"}
    with pytest.raises(UserInputError) as exc:      # leaf2 has one GPU node, leaf1 two
        shape({"gpus_per_node": 1, "nodes": 3, "placement": "one-leaf"}, leaves=LEAVES, nodes=NODES, partition="all")
    assert "a leaf switch with 3 nodes" in str(exc.value)
    got = shape({"gpus_per_node": 4, "nodes": 2, "placement": "spread"}, leaves=LEAVES, nodes=NODES, partition="all")
    assert got == {"nodes": 2, "gpus": 4, "nodelist": "gpu-node1,gpu-node2", "switches": "off"}
    with pytest.raises(UserInputError) as exc:      # leaf2's only GPU node has 8
        shape({"gpus_per_node": 9, "nodes": 2, "placement": "spread"}, leaves=LEAVES, nodes=NODES, partition="all")
    assert exc.value.field == "axes.placement"
    with pytest.raises(UserInputError):
        shape({"gpus_per_node": 1, "nodes": 2, "placement": "spread"}, leaves={})


def test_sprint_file_runs_as_a_sweep_with_one_rule_per_shape():
    from gpuhpc.sprints.shapes import resource_rules
    from gpuhpc.sprints.spec import from_mapping

    spec = from_mapping({"name": "t", "command": "python x.py --bs {batch_size}", "multi_node_template": "mpi",
                         "axes": {"batch_size": [32, 64], "gpus_per_node": [1, 4], "nodes": [1, 2],
                                  "placement": ["one-leaf", "spread"]},
                         "resources": {"partition": "all", "time": "2m"}})
    configs = spec.configurations()
    assert len(configs) == 12          # one node has no placement: 2 batches x 2 GPU counts x 3 layouts
    rules = resource_rules(configs, spec.params_of, leaves=LEAVES, nodes=NODES, partition="all",
                           multi_node_template="mpi")
    assert len(rules) == 6
    sweep = SweepSpec.from_mapping(spec.sweep_mapping(rules))
    assert set(sweep.parameters) == {"batch_size", "gpus_per_node", "layout"}
    trials = sweep.generate()
    assert [spec.config_of(p) for p in trials] == configs
    r = sweep.resources_for({"batch_size": 32, "gpus_per_node": 4, "layout": "2n-spread"})
    assert (r["nodes"], r["gpus"], r["nodelist"], r["switches"]) == (2, 4, "gpu-node1,gpu-node2", "off")
    one = {"batch_size": 32, "gpus_per_node": 4, "layout": "1n"}
    assert (sweep.template_for(one), sweep.template_for({**one, "layout": "2n-one-leaf"})) == ("single", "mpi")
    groups, shapes_of = planner.shape_groups(sweep, [(i, json.dumps(p)) for i, p in enumerate(trials)], 51)
    assert len(groups) == 6 and {t for _, t in shapes_of} == {"single", "mpi"}
    # {nodes} or {placement} in the command: the full grid, each axis a parameter
    full = from_mapping({**spec.model_dump(mode="json"), "command": "x {batch_size} {placement}"})
    assert len(full.configurations()) == 16 and "layout" not in full.sweep_mapping()["parameters"]
    plain = from_mapping({"name": "t", "command": "x {nodes}", "axes": {"nodes": [1, 2]}, "request": False})
    assert "nodes" in plain.sweep_mapping()["parameters"] and plain.sweep_mapping()["template"] == "single"


def test_one_nvlink_is_a_matching_or_constraint_over_the_domains_that_fit():
    from gpuhpc.sprints.shapes import shape
    from gpuhpc.sprints.spec import from_mapping

    nodes = [Node("gpu-node1", 8), Node("mig-node1", 9), Node("gpu-node2", 8), Node("gpu-node3", 8), Node("x", 8)]
    for n, dom in zip(nodes, ("a", "a", "b", "b", "b")):
        n.features = ("h100", f"nvl-{dom}")
    cfg = {"gpus_per_node": 4, "nodes": 2, "placement": "one-nvlink"}
    assert shape(cfg, nodes=nodes, partition="all") == {"nodes": 2, "gpus": 4, "constraint": "[nvl-a|nvl-b]"}
    assert shape({**cfg, "nodes": 3}, nodes=nodes, partition="all")["constraint"] == "nvl-b"   # only b has 3 nodes
    with pytest.raises(UserInputError):                 # 9 GPUs: mig-node1 alone
        shape({**cfg, "gpus_per_node": 9}, nodes=nodes, partition="all")
    with pytest.raises(UserInputError) as exc:
        shape({**cfg, "nodes": 4}, nodes=nodes, partition="all")
    assert exc.value.field == "axes.placement" and "NVLink domain with 4 nodes" in str(exc.value)
    assert shape({**cfg, "nodes": 1}, nodes=nodes) == {"nodes": 1, "gpus": 4}
    spec = from_mapping({"name": "t", "command": "x {batch_size}", "axes": {"nodes": [1, 2],
                         "placement": ["one-leaf", "one-nvlink"]}})
    assert [spec.config_of(spec.params_of(c)) for c in spec.configurations()] == spec.configurations()
    with pytest.raises(UserInputError) as exc:
        from_mapping({"name": "t", "command": "x", "axes": {"placement": ["one-nvlink"]},
                      "resources": {"constraint": "h100"}})
    assert exc.value.field == "resources.constraint"


# ---------------------------------------------------------------- an axis value that is no request
@pytest.mark.parametrize("axis, value, field, said", [
    ("gpus_per_node", 0, "axes.gpus_per_node", "0 is not a whole number >= 1"),
    ("gpus_per_node", "x", "axes.gpus_per_node", "'x' is not a whole number"),
    ("gpus_per_node", ["x"], "axes.gpus_per_node", "'x' is not a whole number"),
    ("gpus_per_node", [1, True], "axes.gpus_per_node", "True is not a whole number"),   # YAML true is not 1 GPU
    ("gpus_per_node", [1.5], "axes.gpus_per_node", "1.5 is not a whole number"),
    ("gpus_per_node", [], "axes.gpus_per_node", "needs at least one value"),
    ("nodes", [1, 0], "axes.nodes", "0 is not a whole number >= 1"),
    ("nodes", "2", "axes.nodes", "'2' is not a whole number"),
    ("nodes", [1, 1], "axes.nodes", "values repeat"),
    ("placement", ["one-leaf", "rack"], "axes.placement[1]", "Input should be"),
])
def test_an_axis_value_that_cannot_be_a_resource_is_refused_naming_the_field_and_the_fix(axis, value, field, said):
    from gpuhpc.sprints.spec import AXIS_HINTS, from_mapping

    with pytest.raises(UserInputError) as exc:
        from_mapping({"name": "t", "command": "x {batch_size}", "axes": {"batch_size": [1, 2], axis: value}})
    e = exc.value
    assert (e.exit_code, e.field) == (2, field) and said in e.message and e.hint == AXIS_HINTS[axis]
    assert f"axes.{axis}: [" in e.one_line() and "\n" not in e.one_line()


def test_one_value_is_a_list_of_one_and_a_short_trial_gets_a_grace_that_fits():
    from gpuhpc.sprints.spec import from_mapping

    spec = from_mapping({"name": "t", "command": "x {batch_size}", "axes": {"batch_size": [1, 2], "gpus_per_node": 2,
                         "nodes": 1}, "resources": {"partition": "all", "time": "1m"}})
    assert (spec.axes.gpus_per_node, spec.axes.nodes) == ((2,), (1,))
    sweep = SweepSpec.from_mapping(spec.sweep_mapping())           # grace 60 s would not fit a 1-minute trial
    assert sweep.grace == 30 and from_mapping({**spec.model_dump(mode="json"), "resources": {"time": "5m"}}
                                              ).sweep_mapping()["grace"] == 60


def test_a_request_no_node_holds_names_the_sprint_axis_not_the_job_field():
    from gpuhpc.jobs.spec import Resources, check_fits
    from gpuhpc.sprints.run import as_axis_error

    for res, field in [({"partition": "all", "gpus": 10}, "axes.gpus_per_node"),
                       ({"partition": "all", "gpus": 8, "nodes": 4}, "axes.nodes")]:
        with pytest.raises(UserInputError) as exc:
            check_fits(Resources.from_mapping(res), NODES)
        got = as_axis_error(exc.value)
        assert got.field == field and got.exit_code == 2 and not got.message.startswith(field + ": gpus")
        assert "axes." in (got.hint or "")
    other = UserInputError("bad", field="grace")
    assert as_axis_error(other) is other


@pytest.mark.parametrize("resources, axes, field", [
    ({"gpus": 4}, {}, "resources.gpus"),
    ({"nodes": 2}, {}, "resources.nodes"),
    ({"nodelist": "gpu-node1,gpu-node2"}, {"nodes": [1, 2]}, "resources.nodelist"),
    ({"switches": "1"}, {"nodes": [2]}, "resources.switches"),
])
def test_a_resource_an_axis_sets_per_configuration_is_refused_not_silently_overridden(resources, axes, field):
    from gpuhpc.sprints.spec import from_mapping

    data = {"name": "t", "command": "x {batch_size}", "axes": {"batch_size": [1, 2], **axes},
            "resources": {"partition": "all", "time": "2m", **resources}}
    with pytest.raises(UserInputError) as exc:
        from_mapping(data)
    assert exc.value.field == field and "request: false" in exc.value.hint
    from_mapping({**data, "request": False, "command": "x {batch_size} {nodes}"})   # the old way: one block for all
    if "nodelist" in resources:                             # one node: no placement picks nodes, the list stays
        from_mapping({**data, "axes": {"batch_size": [1, 2]}})


def test_a_multi_node_configuration_is_never_pinned_to_a_drained_or_down_node():
    from gpuhpc.sprints.shapes import shape

    nodes = [Node("gpu-node1", 8), Node("mig-node1", 9), Node("gpu-node2", 8), Node("gpu-node3", 8)]
    for n, state in zip(nodes, ("IDLE+DRAIN", "MIXED", "DOWN+NOT_RESPONDING", "IDLE+CLOUD+POWERED_DOWN")):
        n.state = state
    leaves = {"leaf1": {"gpu-node1", "mig-node1"}, "leaf2": {"gpu-node2", "gpu-node3"}}
    got = shape({"gpus_per_node": 4, "nodes": 2, "placement": "spread"}, leaves=leaves, nodes=nodes, partition="all")
    assert got["nodelist"] == "mig-node1,gpu-node3"                  # a powered-down cloud node is resumed
    with pytest.raises(UserInputError) as exc:                         # leaf1's pair has a drained node
        shape({"gpus_per_node": 4, "nodes": 2, "placement": "one-leaf"}, leaves={"leaf1": leaves["leaf1"]},
              nodes=nodes, partition="all")
    assert "drained or down now: gpu-node1" in exc.value.message and "resume those nodes" in exc.value.hint
