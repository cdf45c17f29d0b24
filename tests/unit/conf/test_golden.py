"""Rendered configs of the example specs against tests/golden/<spec>/<file>.

Regenerate on purpose (after a deliberate template or spec change), then review the diff:
    GPUHPC_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/conf/test_golden.py
"""
from __future__ import annotations

import os

import pytest

from gpuhpc.conf.render import render_spec
from gpuhpc.spec.cluster import load_spec

from .conftest import EXAMPLES, REPO, SPECS

GOLDEN = REPO / "tests" / "golden"
REGEN = os.environ.get("GPUHPC_REGEN_GOLDEN") == "1"


@pytest.mark.parametrize("spec_name", SPECS)
def test_rendered_configs_match_golden(spec_name):
    files, warnings = render_spec(load_spec(EXAMPLES / f"{spec_name}.yaml"))
    assert warnings == []
    golden_dir = GOLDEN / spec_name
    if REGEN:
        golden_dir.mkdir(parents=True, exist_ok=True)
        for old in golden_dir.iterdir():
            old.unlink()
        for name, text in files.items():
            (golden_dir / name).write_text(text)
    assert sorted(p.name for p in golden_dir.iterdir()) == sorted(files), \
        "golden file set differs; regenerate with GPUHPC_REGEN_GOLDEN=1"
    for name, text in files.items():
        assert text == (golden_dir / name).read_text(), (
            f"{spec_name}/{name} differs from tests/golden; if intended: GPUHPC_REGEN_GOLDEN=1 pytest {__file__}")


def _line(spec_name: str, name: str, start: str) -> str:
    return next(line for line in (GOLDEN / spec_name / name).read_text().splitlines() if line.startswith(start))


def test_the_golden_files_say_what_the_specs_ask():
    """Hand-checked facts (issue 40.10), each worked out from examples/clusters/*.yaml, not from the
    renderer: a regenerated golden file that is wrong fails here even though it is "unchanged" after.
    (tests/golden/local is also checked against the running daemons: tests/integration/slurm/test_golden_live.py)"""
    # dgx-h100-pod: 2 sockets x 56 cores x 2 threads; scratch 30,720 GB in MB; GPUs 0-3 on socket 0
    dgx = _line("dgx-h100-pod", "slurm.conf", "NodeName=dgx[001-030] ")
    assert " CPUs=224 " in dgx and " TmpDisk=31457280 " in dgx and " Gres=gpu:h100:8 " in dgx, dgx
    # the MIG layouts: 3g.40gb 4x1 + 2x2 = 8, 2g.20gb 4x1 = 4, 1g.10gb 4x2 + 2x7 = 22
    mig = _line("dgx-h100-pod", "slurm.conf", "NodeName=dgx[031-032] ")
    assert " Gres=gpu:3g.40gb:8,gpu:2g.20gb:4,gpu:1g.10gb:22 " in mig and " Weight=100 " in mig, mig
    assert _line("dgx-h100-pod", "gres.conf", "NodeName=dgx[001-030] Name=gpu Type=h100 File=/dev/nvidia[0-3]") \
        .endswith(" Cores=0-55")
    # 32 nodes, 8 per leaf, one spine over the four leaves
    assert _line("dgx-h100-pod", "topology.conf", "SwitchName=leaf4 ") == "SwitchName=leaf4 Nodes=dgx[025-032] LinkSpeed=400"
    assert _line("dgx-h100-pod", "topology.conf", "SwitchName=spine1 ") == "SwitchName=spine1 Switches=leaf[1-4]"
    # every HCA of the spec, port 1, exact names (NCCL's leading "="); a job's own setting wins
    hca = _line("nccl/dgx-h100-pod", "nccl-dgx.env", "export NCCL_IB_HCA=")
    assert hca == ('export NCCL_IB_HCA="${NCCL_IB_HCA-=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,'
                   'mlx5_10:1,mlx5_11:1}"')
    # elastic: cloud nodes start powered down; ResumeTimeout = the slowest boot (420 s) + 30 s
    assert _line("elastic", "slurm.conf", "NodeName=spot[01-16],od[01-08] ").endswith(" State=CLOUD")
    assert _line("elastic", "slurm.conf", "ResumeTimeout=") == "ResumeTimeout=450"
    assert _line("elastic", "slurm.conf", "NodeName=fixed[1-2] ").endswith(" State=UNKNOWN")
    # reboots (issue 36.5): RebootProgram by default; ResumeTimeout 600 s where no cloud group sets it,
    # elastic's 450 s (its only ResumeTimeout) where one does; none on local.yaml, whose slurmd share a host
    assert _line("dgx-h100-pod", "slurm.conf", "RebootProgram=") == "RebootProgram=/usr/sbin/reboot"
    assert _line("dgx-h100-pod", "slurm.conf", "ResumeTimeout=") == "ResumeTimeout=600"
    assert _line("elastic", "slurm.conf", "RebootProgram=") == "RebootProgram=/usr/sbin/reboot"
    assert (GOLDEN / "elastic" / "slurm.conf").read_text().count("ResumeTimeout=") == 1
    assert "RebootProgram" not in (GOLDEN / "local" / "slurm.conf").read_text()


def test_the_golden_slurmdbd_conf_says_what_the_specs_ask():
    """Hand-checked (issue 36.3): dgx-h100-pod's slurmdbd section keeps steps 3 months, jobs 24 (archived
    first, to /var/lib/slurm/archive), usage 36, events, reservations, suspend records and sacctmgr's
    transactions 12; local.yaml sets none, so Slurm keeps everything and nothing is written."""
    dgx = (GOLDEN / "dgx-h100-pod" / "slurmdbd.conf").read_text().splitlines()
    assert [line for line in dgx if line.startswith(("Purge", "Archive"))] == [
        "ArchiveDir=/var/lib/slurm/archive", "ArchiveJobs=yes",
        "PurgeEventAfter=12month", "PurgeJobAfter=24month", "PurgeResvAfter=12month", "PurgeStepAfter=3month",
        "PurgeSuspendAfter=12month", "PurgeTXNAfter=12month", "PurgeUsageAfter=36month"]
    local = (GOLDEN / "local" / "slurmdbd.conf").read_text()
    assert "Purge" not in local and "Archive" not in local, local
