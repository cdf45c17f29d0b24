"""Primary and backup controllers in the spec: SlurmctldHost lines in order, SlurmctldTimeout, and
the restart decision for a changed controller list (issue 22, review point 4)."""
from __future__ import annotations

import importlib.util

import pytest

from gpuhpc.conf.render import render_spec
from gpuhpc.errors import UserInputError
from gpuhpc.spec.cluster import load_spec

from .conftest import REPO


def _slurm_conf(local_data, write_spec, **controller) -> str:
    local_data["controller"] = controller
    files, _ = render_spec(load_spec(write_spec(local_data)))
    return files["slurm.conf"]


def test_backups_follow_the_primary_with_the_failover_timeout(local_data, write_spec):
    text = _slurm_conf(local_data, write_spec, hosts=["ctl1", "ctl2", "ctl3"], addr="10.0.0.1", timeout=10)
    lines = [line for line in text.splitlines() if line.startswith(("SlurmctldHost=", "SlurmctldTimeout="))]
    assert lines == ["SlurmctldHost=ctl1(10.0.0.1)", "SlurmctldHost=ctl2", "SlurmctldHost=ctl3", "SlurmctldTimeout=10"]


def test_without_a_timeout_slurms_default_stays(local_data, write_spec):
    assert "SlurmctldTimeout" not in _slurm_conf(local_data, write_spec, hosts=["ctl1", "ctl2"])


def test_a_timeout_below_three_seconds_is_refused(local_data, write_spec):
    local_data["controller"] = {"hosts": ["ctl1", "ctl2"], "timeout": 1}
    with pytest.raises(UserInputError) as err:
        load_spec(write_spec(local_data))
    assert "controller.timeout" in str(err.value)


def _change():
    path = REPO / "ansible" / "plugins" / "filter" / "slurm_conf.py"
    spec = importlib.util.spec_from_file_location("gpuhpc_slurm_conf_filter_ha", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.slurm_conf_change


@pytest.mark.parametrize(("old", "new"), [
    (["a", "b"], ["c", "b"]),     # a new primary, the same backup (the last line alike)
    (["a"], ["a", "b"]),          # a backup added
    (["a", "b"], ["b", "a"]),     # the roles swapped
])
def test_any_change_of_the_controller_list_restarts_slurmctld(local_data, write_spec, old, new):
    old_text = _slurm_conf(local_data, write_spec, hosts=old)
    new_text = _slurm_conf(local_data, write_spec, hosts=new)
    got = _change()({"slurm.conf": old_text}, {"slurm.conf": new_text})
    assert got["restart"] == ["slurmctld"], got


def test_a_new_failover_timeout_is_a_reconfigure(local_data, write_spec):
    old_text = _slurm_conf(local_data, write_spec, hosts=["a", "b"], timeout=10)
    new_text = _slurm_conf(local_data, write_spec, hosts=["a", "b"], timeout=30)
    got = _change()({"slurm.conf": old_text}, {"slurm.conf": new_text})
    assert got["restart"] == [] and got["reconfigure"], got
