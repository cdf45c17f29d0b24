"""Elastic capacity in the cluster spec: rendering (State=CLOUD, the power-saving block, one
partition per price tier) against tests/golden/elastic/, and the validation rules.

Regenerate on purpose: GPUHPC_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/elastic/test_elastic_conf.py
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from gpuhpc.conf.render import render_spec
from gpuhpc.conf.validate import validate
from gpuhpc.errors import SpecError
from gpuhpc.spec.cluster import load_spec, spec_from_data

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "clusters" / "elastic.yaml"
GOLDEN = REPO / "tests" / "golden" / "elastic"
REGEN = os.environ.get("GPUHPC_REGEN_GOLDEN") == "1"


@pytest.fixture()
def data() -> dict:
    return copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))


def test_elastic_example_matches_golden():
    files, warnings = render_spec(load_spec(EXAMPLE))
    assert [w for w in warnings if "StoragePass" not in w] == []
    if REGEN:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (GOLDEN / name).write_text(text)
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(files)
    for name, text in files.items():
        assert text == (GOLDEN / name).read_text(), f"elastic/{name} differs; GPUHPC_REGEN_GOLDEN=1 pytest {__file__}"


def test_the_power_block_as_slurm_reads_it():
    files, _ = render_spec(load_spec(EXAMPLE))
    conf = files["slurm.conf"]
    lines = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and " " not in line.split("=", 1)[0]
                 and not line.startswith(("NodeName", "PartitionName", "#")))
    assert lines["ResumeProgram"] == "/usr/local/sbin/gpuhpc-power-resume"
    assert lines["ResumeFailProgram"] == "/usr/local/sbin/gpuhpc-power-resume-fail"
    assert lines["ResumeTimeout"] == "450"          # slowest boot 420 + 30
    assert lines["SuspendTime"] == "600"
    assert lines["ResumeRate"] == lines["SuspendRate"] == "0"
    assert lines["SuspendExcNodes"] == "fixed[1-2]"
    assert "idle_on_node_suspend" in lines["SlurmctldParameters"]
    assert "cred_expire=120" in lines["AuthInfo"] and lines["SuspendTimeout"] == "300"
    assert "NodeName=spot[01-16],od[01-08] " in conf and conf.count("State=CLOUD") == 1
    assert "NodeName=fixed[1-2] " in conf and "State=UNKNOWN" in conf


def test_no_cloud_group_renders_no_power_block():
    files, _ = render_spec(load_spec(REPO / "examples" / "clusters" / "dgx-h100-pod.yaml"))
    assert "ResumeProgram" not in files["slurm.conf"] and "State=CLOUD" not in files["slurm.conf"]


def test_cred_expire_and_suspend_timeout_default_to_what_holds_on_a_busy_cluster(data):
    """Slurm's and slurm-gcp's 120 s / 300 s (issue 38.7): a shorter credential can expire before a
    busy node takes it; a spec that sets them keeps its values."""
    data["runtime"].pop("cred_expire", None)
    data["power"].pop("suspend_timeout", None)
    conf = render_spec(spec_from_data(data))[0]["slurm.conf"]
    assert "cred_expire=120" in conf and "\nSuspendTimeout=300\n" in conf
    data["runtime"]["cred_expire"], data["power"]["suspend_timeout"] = 30, 60
    conf = render_spec(spec_from_data(data))[0]["slurm.conf"]
    assert "cred_expire=30" in conf and "\nSuspendTimeout=60\n" in conf


def test_resume_timeout_shorter_than_boot_is_refused(data):
    data["power"]["resume_timeout"] = 300
    with pytest.raises(SpecError) as exc:
        validate(spec_from_data(data))
    assert exc.value.exit_code == 2 and exc.value.field == "power.resume_timeout"
    assert "boot_timeout 420" in exc.value.one_line()


def test_a_partition_mixing_cloud_price_tiers_is_refused(data):
    data["partitions"][2]["nodes"] = ["spot", "ondemand"]
    with pytest.raises(SpecError) as exc:
        validate(spec_from_data(data))
    assert exc.value.field == "partitions[2].nodes" and "Weight" in exc.value.one_line()


def test_spot_nodes_need_job_requeue(data):
    """As PreemptMode=REQUEUE does: a reclaim sets the node DOWN and Slurm requeues only a
    requeueable job, so JobRequeue=1 makes every batch job on spot requeue by default (a job opts
    out with --no-requeue); the on-demand tiers alone do not need it."""
    data.setdefault("runtime", {})["job_requeue"] = False
    with pytest.raises(SpecError) as exc:
        validate(spec_from_data(data))
    assert exc.value.field == "partitions[2].nodes" and "NODE_FAIL" in exc.value.one_line()
    data["partitions"] = [p for p in data["partitions"] if p["name"] != "spot"]
    validate(spec_from_data(data))


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"provider": None}, "node_groups[1]", "needs a provider"),
    ({"max_nodes": 99}, "node_groups[1]", "above count"),
    ({"market": "reserved"}, "node_groups[1].market", ""),
    ({"instance_types": ["p5 48xlarge"]}, "node_groups[1].instance_types[0]", ""),
])
def test_cloud_group_fields_are_checked(data, change, field, words):
    data["node_groups"][1].update(change)
    with pytest.raises(SpecError) as exc:
        spec_from_data(data)
    assert exc.value.field == field and words in exc.value.one_line()


def test_cloud_fields_on_a_static_group_are_refused(data):
    data["node_groups"][0]["boot_timeout"] = 60
    with pytest.raises(SpecError) as exc:
        spec_from_data(data)
    assert exc.value.field == "node_groups[0]" and "only for capacity: cloud" in exc.value.one_line()
