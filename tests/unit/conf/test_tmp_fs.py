"""Several slurmd on one host (``runtime.multiple_slurmd``, the local cluster) share its ``/tmp``.
mpi/pmix makes each step's client directory ``spmix_appdir_<uid>_<job>.<step>`` under ``TmpFS`` on
every node of the step, so the second node on the host found the first's and the step failed
("Cannot create directory ... File exists"). Each node's TmpFS is its own spool directory (``%n``,
expanded by slurmd); one slurmd per host keeps Slurm's default (/tmp)."""
from __future__ import annotations

from gpuhpc.conf.render import render_spec
from gpuhpc.spec.cluster import spec_from_data


def _slurm_conf(data: dict) -> list[str]:
    files, _ = render_spec(spec_from_data(data), storage_pass="pw-12345678")
    return files["slurm.conf"].splitlines()


def test_each_slurmd_on_a_shared_host_gets_its_own_tmp_fs(local_data):
    local_data["runtime"]["multiple_slurmd"] = True
    lines = _slurm_conf(local_data)
    spool = next(line.split("=", 1)[1] for line in lines if line.startswith("SlurmdSpoolDir="))
    assert spool.endswith("/%n")
    assert f"TmpFS={spool}" in lines


def test_one_slurmd_per_host_keeps_slurms_default_tmp_fs(local_data):
    local_data["runtime"]["multiple_slurmd"] = False
    for group in local_data["node_groups"]:
        group.pop("node_hostname", None)
    assert not [line for line in _slurm_conf(local_data) if line.startswith("TmpFS")]
