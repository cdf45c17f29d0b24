"""One test per validation rule: `gpuhpc conf validate` and `gpuhpc conf render` exit 2 with a
one-line error naming the field, and render writes nothing."""
from __future__ import annotations

import pytest

from gpuhpc.cli.main import main


def _run(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _set(data, path, value):
    if path == ["partitions", 0, "max_time"] and value == "1:00:00":
        data["partitions"][0]["default_time"] = "2:00:00"
    cur = data
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value


CASES = [
    # (id, path to change, new value, field named in the error, words in the message)
    ("mig-too-many-slices", ["node_groups", 1, "gpus", "mig", 1], ["3g.40gb", "3g.40gb", "1g.10gb"],
     "node_groups[1].gpus.mig[1]", "memory slices"),
    ("mig-unknown-profile", ["node_groups", 1, "gpus", "mig", 0], ["5g.50gb"],
     "node_groups[1].gpus.mig[0]", "not a MIG profile"),
    ("mig-profile-limit", ["node_groups", 1, "gpus", "mig", 0], ["1g.10gb"] * 8,
     "node_groups[1].gpus.mig[0]", "at most 7"),
    ("mig-layout-count", ["node_groups", 1, "gpus", "mig"], [["7g.80gb"]],
     "node_groups[1].gpus.mig", "1 layouts for 2 GPUs"),
    ("mig-on-l40s", ["node_groups", 1, "gpus", "type"], "l40s",
     "node_groups[1].gpus.mig[0]", "does not support MIG"),
    ("duplicate-node", ["node_groups", 2, "hostname"], "gpu-node{n}",
     "node_groups[2].hostname", "duplicate node name 'gpu-node1'"),
    ("duplicate-group", ["node_groups", 2, "name"], "gpu",
     "node_groups[2].name", "duplicate node group"),
    ("unknown-partition-node", ["partitions", 1, "nodes"], ["gpu-node[1-3]"],
     "partitions[1].nodes[0]", "unknown node 'gpu-node3'"),
    ("memory-above-physical", ["node_groups", 0, "real_memory_mb"], 70000,
     "node_groups[0].real_memory_mb", "above the physical"),
    ("bad-preempt-mode", ["partitions", 0, "preempt_mode"], "KILL",
     "partitions[0].preempt_mode", "not a PreemptMode"),
    ("bad-max-time", ["partitions", 0, "max_time"], "1:75:00",
     "partitions[0].max_time", "minutes/seconds must be < 60"),
    ("bad-time-format", ["partitions", 0, "max_time"], "two days",
     "partitions[0].max_time", "not a Slurm time"),
    ("default-time-above-max", ["partitions", 0, "max_time"], "1:00:00",
     "partitions[0].default_time", "longer than max_time"),
    ("uppercase-cluster-name", ["name"], "Local",
     "name", "lowercase"),
    ("two-defaults", ["partitions", 1, "default"], True,
     "partitions[1].default", "more than one default"),
    ("duplicate-partition", ["partitions", 1, "name"], "gpu",
     "partitions[1].name", "duplicate partition"),
    ("unknown-allow-qos", ["partitions", 0, "allow_qos"], ["gold"],
     "partitions[0].allow_qos[0]", "unknown QOS 'gold'"),
    ("unknown-allow-account", ["partitions", 0, "allow_accounts"], ["nobody"],
     "partitions[0].allow_accounts[0]", "unknown account"),
    ("qos-preempts-unknown", ["qos", 2, "preempt"], ["urgent"],
     "qos[2].preempt[0]", "unknown QOS"),
    ("account-unknown-qos", ["accounts", 0, "qos"], ["normal", "gold"],
     "accounts[0].qos[1]", "unknown QOS"),
    ("affinity-count", ["node_groups", 0, "gpus", "cpu_affinity"], ["0-7"],
     "node_groups[0].gpus.cpu_affinity", "1 entries for 8 GPUs"),
    ("affinity-core-range", ["node_groups", 0, "gpus", "cpu_affinity"], ["0-7"] * 7 + ["8-16"],
     "node_groups[0].gpus.cpu_affinity[7]", "core 16 does not exist"),
    ("port-clash", ["node_groups", 2, "port"], 17102,
     "node_groups[2].port", "already used by gpu-node2"),
    ("port-is-slurmctld", ["node_groups", 2, "port"], 6817,
     "node_groups[2].port", "slurmctld port"),
    ("switch-unknown-node", ["topology", "switches", 0, "nodes"], ["gpu-node9"],
     "topology.switches[0].nodes[0]", "unknown node"),
    ("node-under-two-leaves", ["topology", "switches", 1, "nodes"], ["gpu-node2", "gpu-node1"],
     "topology.switches[1].nodes", "already under switch 'leaf1'"),
    ("switch-unknown-switch", ["topology", "switches", 2, "switches"], ["leaf1", "leaf3"],
     "topology.switches[2].switches[1]", "unknown switch"),
    ("unknown-field", ["node_groups", 0, "gpu"], {"type": "h100"},
     "node_groups[0].gpu", "unknown field"),
    ("bad-type", ["node_groups", 0, "count"], "two",
     "node_groups[0].count", "valid integer"),
    ("zero-gpus", ["node_groups", 0, "gpus", "count"], 0,
     "node_groups[0].gpus.count", "greater than or equal to 1"),
    ("bad-node-name", ["node_groups", 0, "hostname"], "gpu node{n}",
     "node_groups[0].hostname", "not a valid name"),
    ("space-in-parameter", ["runtime", "scheduler_parameters"], ["bf_interval=5 #x"],
     "runtime.scheduler_parameters[0]", "may only contain"),
    ("control-char-in-description", ["accounts", 0, "description"], "a\x1bb",
     "accounts[0].description", "control characters"),
    ("suspend-without-gang", ["preemption", "mode"], "SUSPEND",
     "preemption.mode", "requires GANG"),
    ("preempt-without-type", ["preemption", "type"], "none",
     "partitions[0].preempt_mode", "preemption.type is none"),
    ("partition-prio-with-mode-off", ["preemption", "mode"], "OFF",
     "preemption.mode", "preempt/partition_prio with PreemptMode=OFF: Slurm refuses"),
    ("management-network-not-cidr", ["management_networks"], ["10.10.0.1/16"],
     "management_networks[0]", "not a network in CIDR form"),
]


@pytest.mark.parametrize(("path", "value", "field", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_rejects_with_field_path(capsys, tmp_path, local_data, write_spec, path, value, field, words):
    _set(local_data, path, value)
    spec = write_spec(local_data)

    rc, _, err = _run(capsys, ["conf", "validate", str(spec)])
    assert rc == 2, err
    line = err.strip()
    assert "\n" not in line, "the error must be one line"
    assert line.startswith(f"error: {field}: "), line
    assert words in line

    out = tmp_path / "out"
    rc, _, err = _run(capsys, ["conf", "render", str(spec), "-o", str(out)])
    assert rc == 2
    assert not out.exists() or not any(out.iterdir()), "render must write nothing on a bad spec"


def test_mig_fits_real_geometry(capsys, local_data, write_spec):
    local_data["node_groups"][1]["gpus"]["mig"] = [["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], ["4g.40gb", "3g.40gb"]]
    rc, out, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 0, err
    assert out.startswith("ok: cluster local")


def test_missing_file_exits_2(capsys, tmp_path):
    rc, _, err = _run(capsys, ["conf", "validate", str(tmp_path / "nope.yaml")])
    assert rc == 2
    assert "cannot read" in err


def test_bad_yaml_exits_2(capsys, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    rc, _, err = _run(capsys, ["conf", "validate", str(p)])
    assert rc == 2
    assert "not valid YAML" in err


def test_low_cpu_per_gpu_ratio_warns(capsys, local_data, write_spec):
    local_data["node_groups"][0]["sockets"] = 1    # 8 CPUs for 8 GPUs
    local_data["node_groups"][0]["gpus"]["cpu_affinity"] = None
    rc, _, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 0
    assert "below 2 vCPU/GPU" in " ".join(err.split())


def test_examples_validate_without_warnings(capsys, repo_root):
    for name in ("local", "dgx-h100-pod"):
        rc, out, err = _run(capsys, ["conf", "validate", str(repo_root / "examples" / "clusters" / f"{name}.yaml")])
        assert rc == 0, err
        assert "warning" not in err


def test_spec_is_frozen(repo_root):
    from pydantic import ValidationError

    from gpuhpc.spec.cluster import load_spec

    spec = load_spec(repo_root / "examples" / "clusters" / "local.yaml")
    with pytest.raises(ValidationError):
        spec.name = "other"
