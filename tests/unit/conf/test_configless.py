"""Configless compute nodes (issue 36.4): ``node_groups[].configless`` renders
``SlurmctldParameters=enable_configless`` (merged with the spec's own values), gives the roles the
``slurmd --conf-server`` value, and is refused where a node needs a file of its own."""
from __future__ import annotations

import copy
from pathlib import Path

import jinja2
import pytest
import yaml

from gpuhpc.cli.main import main
from gpuhpc.conf.context import build_context
from gpuhpc.conf.render import render_spec
from gpuhpc.conf.validate import validate
from gpuhpc.spec.cluster import spec_from_data

from .conftest import EXAMPLES, REPO

LAB_SPEC = REPO / "ansible" / "inventories" / "lab" / "cluster.yaml"
SLURMD_DEFAULT = REPO / "ansible" / "roles" / "gpuhpc_slurm_compute" / "templates" / "slurmd.default.j2"


def _dgx(**group) -> dict:
    data = copy.deepcopy(yaml.safe_load((EXAMPLES / "dgx-h100-pod.yaml").read_text()))
    data["node_groups"][0].update(group)
    return data


def _line(text: str, key: str) -> str | None:
    return next((ln for ln in text.splitlines() if ln.startswith(key + "=")), None)


def test_configless_adds_enable_configless_to_the_spec_s_own_slurmctld_parameters():
    files, _ = render_spec(spec_from_data(_dgx(configless=True)), slurm_version="24.11")
    params = _line(files["slurm.conf"], "SlurmctldParameters").split("=", 1)[1].split(",")
    assert "enable_configless" in params
    # the spec's own value stays (24.11 moved preempt_send_user_signal to PreemptParameters)
    files22, _ = render_spec(spec_from_data(_dgx(configless=True)), slurm_version="22.05")
    assert _line(files22["slurm.conf"], "SlurmctldParameters") == \
        "SlurmctldParameters=preempt_send_user_signal,enable_configless"


def test_without_configless_nothing_changes():
    files, _ = render_spec(spec_from_data(_dgx()), slurm_version="22.05")
    assert "enable_configless" not in files["slurm.conf"]
    assert build_context(spec_from_data(_dgx()))["conf_server"] is None


def test_enable_configless_given_by_hand_is_not_written_twice():
    data = _dgx(configless=True)
    data["runtime"]["slurmctld_parameters"] = ["enable_configless"]
    ctx = build_context(spec_from_data(data))
    assert ctx["slurmctld_parameters"].split(",").count("enable_configless") == 1


def test_conf_server_names_the_controllers_in_order_with_a_port_only_when_not_6817():
    data = _dgx(configless=True)
    assert build_context(spec_from_data(data))["conf_server"] == "slurm-ctl1,slurm-ctl2"
    data["runtime"]["slurmctld_port"] = 7817
    data["controller"]["addr"] = "10.0.0.5"
    assert build_context(spec_from_data(data))["conf_server"] == "10.0.0.5:7817,slurm-ctl2:7817"


def test_nodes_say_which_are_configless():
    data = _dgx(configless=True)
    data["node_groups"].append({**data["node_groups"][0], "name": "other", "hostname": "other{n}",
                                "configless": False})
    nodes = build_context(spec_from_data(data))["nodes"]
    assert {n["configless"] for n in nodes if n["group"] == data["node_groups"][0]["name"]} == {True}
    assert {n["configless"] for n in nodes if n["group"] == "other"} == {False}


def test_the_lab_s_compute_hosts_are_configless_and_their_slurmd_gets_conf_server():
    """The lab's spec (c1, c2 configless) and the compute role's /etc/default/slurmd for it."""
    spec = spec_from_data(yaml.safe_load(LAB_SPEC.read_text()))
    validate(spec)
    ctx = build_context(spec, slurm_version="24.11")
    assert {n["name"]: n["configless"] for n in ctx["nodes"]} == {"c1": True, "c2": True}
    assert "enable_configless" in ctx["slurmctld_parameters"].split(",")
    assert ctx["conf_server"] == "ctl,login"
    env = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    text = env.from_string(SLURMD_DEFAULT.read_text()).render(
        gpuhpc_slurm_common_conf=ctx, ansible_managed="Ansible managed")
    opts = [ln for ln in text.splitlines() if ln.startswith("SLURMD_OPTIONS=")]
    assert opts == ['SLURMD_OPTIONS="--conf-server ctl,login"']


@pytest.mark.parametrize("change, words", [
    ({"runtime": {"multiple_slurmd": True}}, "multiple_slurmd"),
    ({"runtime": {"gres_autodetect": "off"}, "mig": True}, "gres.conf"),
])
def test_configless_refuses_what_a_node_needs_its_own_file_for(capsys, tmp_path, change, words):
    data = _dgx(configless=True)
    data["runtime"].update(change["runtime"])
    if change.get("mig"):
        data["node_groups"][0]["gpus"]["mig"] = [["3g.40gb", "3g.40gb"]] + [[]] * (data["node_groups"][0]["gpus"]["count"] - 1)
    if data["runtime"].get("multiple_slurmd"):
        data["node_groups"][0]["port"] = 17000
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    rc = main(["conf", "validate", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "node_groups[0].configless" in err and words in err
    assert len(err.strip().splitlines()) == 1
    # the same spec without configless passes
    data["node_groups"][0]["configless"] = False
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["conf", "validate", str(path)]) == 0, capsys.readouterr().err


def test_configless_must_be_a_bool(capsys, tmp_path):
    data = _dgx(configless="sometimes")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["conf", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "node_groups[0].configless" in err
