"""One spec, two Slurm releases: Debian 12's 22.05 (the golden files) and Debian 13's 24.11.

What 24.11 renamed or removed, checked against each release's slurm.conf(5) (SchedMD/slurm tags
slurm-22-05-9-1, slurm-23-02-8-1, slurm-23-11-9-1, slurm-24-11-5-1): topology/none is
topology/default from 23.11; PrivateData=cloud is gone from 23.02; preempt_send_user_signal moved
to PreemptParameters=send_user_signal in 23.02; task/none, preempt/none and jobcomp/none are not
listed in 24.11 (unset means the same).
"""
from __future__ import annotations

import pytest

from gpuhpc.conf.context import slurm_release
from gpuhpc.conf.render import render_spec
from gpuhpc.errors import UserInputError
from gpuhpc.spec.cluster import load_spec

from .conftest import EXAMPLES, REPO


def _lines(spec: str, version: str | None) -> list[str]:
    files, _ = render_spec(load_spec(EXAMPLES / f"{spec}.yaml"), slurm_version=version)
    return files["slurm.conf"].splitlines()


@pytest.mark.parametrize("text, want", [("22.05", (22, 5)), ("24.11.5", (24, 11)), ("24.11.5-4+deb13u1", (24, 11)),
                                        ("slurm 22.05.8", (22, 5)), ("slurm-wlm 23.11.4-1", (23, 11))])
def test_slurm_release_reads_sinfo_and_dpkg_versions(text, want):
    assert slurm_release(text) == want


@pytest.mark.parametrize("text", ["", "24", "latest", "2.4.11"])
def test_a_malformed_slurm_version_is_refused_naming_the_field(text):
    with pytest.raises(UserInputError, match="slurm_version"):
        slurm_release(text)


def test_22_05_is_the_default_and_renders_the_golden_files():
    assert _lines("local", None) == _lines("local", "22.05")
    assert "\n".join(_lines("local", "22.05")) + "\n" == (REPO / "tests/golden/local/slurm.conf").read_text()


def test_24_11_leaves_out_what_it_removed_and_renames_the_rest():
    lab = load_spec(REPO / "ansible/inventories/lab/cluster.yaml")
    old = render_spec(lab, slurm_version="22.05")[0]["slurm.conf"].splitlines()
    new = render_spec(lab, slurm_version="24.11")[0]["slurm.conf"].splitlines()
    assert {"TaskPlugin=task/none", "PreemptType=preempt/none", "JobCompType=jobcomp/none"} <= set(old)
    assert not [x for x in new if x.startswith(("TaskPlugin=", "PreemptType=", "JobCompType="))]
    assert "# for Slurm 24.11" in new
    # the rest is the same file (and a tree without switches is flat, below)
    assert [x for x in new if not x.startswith(("#", "TopologyPlugin="))] == [
        x for x in old if not x.startswith(("#", "TaskPlugin=", "PreemptType=", "JobCompType=", "TopologyPlugin="))]


def test_24_11_preemption_signal_and_topology():
    old, new = _lines("local", "22.05"), _lines("local", "24.11")
    ctld = [x for x in old if x.startswith("SlurmctldParameters=")]
    assert ctld and "preempt_send_user_signal" in ctld[0]
    assert "PreemptParameters=send_user_signal" in new
    assert "preempt_send_user_signal" not in "\n".join(new)
    assert "PreemptType=preempt/partition_prio" in new
    assert "PropagateResourceLimitsExcept=MEMLOCK" in old and "PropagateResourceLimitsExcept=MEMLOCK" in new


def test_cloud_nodes_need_private_data_only_before_23_02():
    assert "PrivateData=cloud" in _lines("elastic", "22.05")
    assert "PrivateData=cloud" not in _lines("elastic", "23.02")
    assert "PrivateData=cloud" not in _lines("elastic", "24.11")


def test_topology_none_is_topology_default_from_23_11():
    spec = load_spec(REPO / "ansible/inventories/lab/cluster.yaml")
    spec = spec.model_copy(update={"topology": spec.topology.model_copy(update={"plugin": "none"})})
    files = {v: render_spec(spec, slurm_version=v)[0]["slurm.conf"] for v in ("23.02", "23.11")}
    assert "TopologyPlugin=topology/none" in files["23.02"]
    assert "TopologyPlugin=topology/default" in files["23.11"]


def test_a_tree_without_switches_is_flat_from_23_11():
    lab = load_spec(REPO / "ansible/inventories/lab/cluster.yaml")
    assert lab.topology.plugin == "tree" and not lab.topology.switches
    assert "TopologyPlugin=topology/tree" in render_spec(lab, slurm_version="22.05")[0]["slurm.conf"]
    assert "TopologyPlugin=topology/default" in render_spec(lab, slurm_version="24.11")[0]["slurm.conf"]
    # with switches it stays a tree
    assert "TopologyPlugin=topology/tree" in _lines("dgx-h100-pod", "24.11")
