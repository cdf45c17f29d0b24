"""Secure defaults of the cluster spec (issue 26, point 10): a preempting partition open to every
account, GPUs without device constraint, and no submit limit are refused or warned about."""
from __future__ import annotations

import pytest

from gpuhpc.cli.main import main


def _run(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _part(data, name):
    return next(p for p in data["partitions"] if p["name"] == name)


def test_the_examples_pass(capsys):
    for name in ("local", "dgx-h100-pod"):
        rc, _, err = _run(capsys, ["conf", "validate", f"examples/clusters/{name}.yaml"])
        assert rc == 0, err


def test_a_preempting_partition_open_to_everyone_is_refused(capsys, local_data, write_spec):
    del _part(local_data, "gpu-hi")["allow_accounts"]
    rc, _, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 2 and err.count("\n") == 1
    assert "partitions[1].allow_accounts" in err and "preempts gpu, gpu-grace, all" in err, err
    _part(local_data, "gpu-hi")["allow_qos"] = ["high"]           # a QOS restriction does as well
    rc, _, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 0, err


def test_allow_accounts_knows_slurms_root_account_and_no_other_unknown(capsys, local_data, write_spec):
    _part(local_data, "gpu-hi")["allow_accounts"] = ["root", "nosuch"]
    rc, _, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 2 and "partitions[1].allow_accounts[1]" in err and "unknown account 'nosuch'" in err


def test_a_partition_that_preempts_no_one_needs_no_restriction(capsys, local_data, write_spec):
    for p in local_data["partitions"]:
        if p["name"] != "gpu-hi":
            p["preempt_mode"] = "OFF"
    del _part(local_data, "gpu-hi")["allow_accounts"]
    rc, _, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 0, err


@pytest.mark.parametrize("change", [
    {"proctrack": "linuxproc", "task_plugins": ["none"]},
    {"proctrack": "cgroup", "task_plugins": ["affinity", "cgroup"], "cgroup_constrain": ["cores", "ram"]},
])
def test_gpus_without_device_constraint_need_a_reason(capsys, local_data, write_spec, change):
    rt = local_data["runtime"]
    del rt["unconstrained_gpus_reason"]
    rt.update(change)
    rc, _, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 2 and err.count("\n") == 1 and "runtime.task_plugins" in err and "unconstrained_gpus_reason" in err
    rt["unconstrained_gpus_reason"] = "a test machine"
    assert _run(capsys, ["conf", "validate", str(write_spec(local_data))])[0] == 0


def test_device_constraint_passes_without_a_reason(capsys, local_data, write_spec):
    rt = local_data["runtime"]
    del rt["unconstrained_gpus_reason"]
    rt.update(proctrack="cgroup", task_plugins=["affinity", "cgroup"])
    rc, _, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 0, err


def test_no_submit_limit_is_a_warning(capsys, local_data, write_spec):
    for q in local_data["qos"]:
        del q["max_submit_jobs_per_user"]
    rc, out, err = _run(capsys, ["conf", "validate", str(write_spec(local_data))])
    assert rc == 0 and "max_submit_jobs_per_user" in out + err
