"""The torchrun template with the real torchrun (Debian's torch 1.13: torch_torchrun.py, where
test_jobs_launch.py uses fake_torchrun.py): a 2-node job, two workers per node, static
rendezvous at the first node's NodeAddr; every worker has torchrun's own distributed environment.
The program is named without ``python`` (torchrun runs it with its interpreter) and, as users
write it, after ``python -u`` (the template keeps the interpreter: torchrun's ``--no_python``, the
spelling torch 1.x knows)."""
from __future__ import annotations

import json

import pytest

from jobs_helpers import HERE, gpuhpc, job_state
from polling import wait_for
from torch_compat import require_torch

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("interpreter", [(), ("/usr/bin/python3", "-u")], ids=["script", "python-u-script"])
def test_real_torchrun_two_nodes_consistent_environment(jobs_env, tmp_path, slurm, track, interpreter):
    require_torch()
    out = tmp_path / "ranks"
    out.mkdir()
    res = gpuhpc("submit", "--template", "torchrun", "--nodes", "2", "--gpus", "2", "--gpu-type", "h100",
                 "--partition", "gpu", "--time", "15m", "--name", "gpuhpc-test-real-torchrun", "--json", "--",
                 *interpreter, str(HERE / "print_dist_env.py"), str(out), "--lr", "3e-4",
                 env={"GPUHPC_TORCHRUN": str(HERE / "torch_torchrun.py")})
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 120,
             f"torchrun job {job_id}")
    from gpuhpc.jobs.api import Job

    job = Job(job_id, client=slurm)
    log = job.logs()
    assert job.state.value == "COMPLETED", log[-3000:]
    envs = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1, 2, 3], log[-3000:]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    for e in envs:
        assert int(e["RANK"]) == int(e["GROUP_RANK"]) * 2 + int(e["LOCAL_RANK"])
        assert e["GROUP_RANK"] == e["SLURM_NODEID"]
        assert e["argv"] == ["--lr", "3e-4"]
    assert {e["SLURMD_NODENAME"] for e in envs} == {"gpu-node1", "gpu-node2"}
    first = next(e["SLURMD_NODENAME"] for e in envs if e["GROUP_RANK"] == "0")
    rec = slurm.run(["scontrol", "--oneliner", "show", "node", first]).stdout
    addr = [w.split("=", 1)[1] for w in rec.split() if w.startswith("NodeAddr=")]
    assert addr and {e["MASTER_ADDR"] for e in envs} == {addr[0]}      # the template's rendezvous address
    assert len({e["MASTER_PORT"] for e in envs}) == 1
