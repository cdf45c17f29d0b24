"""Resources and ports of torchrun jobs on the real cluster: an 8-GPU torchrun job's srun step
gets all the CPUs the job got per GPU (srun no longer inherits them from sbatch), and two
torchrun jobs on one node both start, one of them with its derived rendezvous port taken.

The job asks for no CPUs or memory: the gpu partition's DefCpuPerGPU/DefMemPerGPU (from the
cluster spec's node sizing) apply. ``nproc`` inside the step is printed, not asserted: this host
has 2 cores under 16-CPU fake nodes, and TaskPlugin=task/none binds nothing."""
from __future__ import annotations

import json
import socket
import sys

import pytest

from jobs_helpers import HERE, gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration

CPUS_PER_GPU, MEM_PER_GPU_MB = 2, 8000           # examples/clusters/local.yaml: 16 CPUs, 64000 MB, 8 GPUs
STEP_PROBE = ("import json, os, sys; "
              "json.dump({'cpus_per_task': os.environ.get('SLURM_CPUS_PER_TASK'), "
              "'nproc': len(os.sched_getaffinity(0)), 'step': os.environ.get('SLURM_STEP_ID'), "
              "'rank': os.environ.get('RANK')}, open(os.path.join(sys.argv[1], 'rank-' + os.environ['RANK'] + '.json'), 'w'))")


def _done(slurm, job_id):
    return lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def test_an_8_gpu_torchrun_step_gets_the_jobs_cpus(jobs_env, tmp_path, slurm, track):
    out = tmp_path / "ranks"
    out.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(STEP_PROBE + "\n")
    res = gpuhpc("submit", "--template", "torchrun", "--gpus", "8", "--gpu-type", "h100", "--partition", "gpu",
                 "--nodelist", "gpu-node1", "--time", "10m", "--name", "gpuhpc-test-cpus", "--json", "--",
                 sys.executable, str(probe), str(out),
                 env={"GPUHPC_TORCHRUN": str(HERE / "fake_torchrun.py")})
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("RUNNING", "COMPLETED"), 120, f"job {job_id} to start")
    rec = slurm.show_job(job_id)
    num_cpus = int(rec["NumCPUs"])
    tres = dict(kv.split("=", 1) for kv in rec["TRES"].split(","))
    wait_for(_done(slurm, job_id), 120, f"job {job_id}")
    from gpuhpc.jobs.api import Job

    assert job_state(slurm, job_id) == "COMPLETED", Job(job_id, client=slurm).logs()
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert num_cpus == CPUS_PER_GPU * 8 and tres["cpu"] == str(CPUS_PER_GPU * 8), rec
    mem_mb = float(tres["mem"][:-1]) * {"M": 1, "G": 1024, "T": 1024 ** 2}[tres["mem"][-1]]   # 62.50G
    assert mem_mb == MEM_PER_GPU_MB * 8, rec
    assert len(ranks) == 8 and {r["cpus_per_task"] for r in ranks} == {str(CPUS_PER_GPU * 8)}, ranks
    assert all(r["step"] == "0" for r in ranks)
    print(f"job {job_id}: NumCPUs={num_cpus}, mem={tres['mem']}, step SLURM_CPUS_PER_TASK={ranks[0]['cpus_per_task']}, "
          f"nproc in the step={ranks[0]['nproc']} (TaskPlugin=task/none here: no CPU binding to count)")


def test_two_torchrun_jobs_on_one_node_both_start(jobs_env, tmp_path, slurm, track):
    jobs = []
    for i in range(2):
        out = tmp_path / f"ranks{i}"
        out.mkdir()
        res = gpuhpc("submit", "--template", "torchrun", "--gpus", "2", "--gpu-type", "h100", "--partition", "gpu",
                     "--nodelist", "gpu-node1", "--time", "10m", "--name", f"gpuhpc-test-port{i}", "--hold",
                     "--json", "--", "python", str(HERE / "print_dist_env.py"), str(out),
                     env={"GPUHPC_TORCHRUN": str(HERE / "fake_torchrun.py")})
        assert res.returncode == 0, res.stderr
        jobs.append((json.loads(res.stdout)["job_id"], out))
        track(jobs[-1][0])
    derived = 15000 + int(jobs[0][0]) % 17000
    with socket.create_server(("", derived)):          # the first job's derived port is taken
        for job_id, _ in jobs:
            slurm.run(["scontrol", "release", job_id])
        for job_id, _ in jobs:
            wait_for(_done(slurm, job_id), 120, f"job {job_id}")
    ports = []
    for job_id, out in jobs:
        assert job_state(slurm, job_id) == "COMPLETED"
        envs = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
        assert len(envs) == 2 and len({e["MASTER_PORT"] for e in envs}) == 1
        ports.append(int(envs[0]["MASTER_PORT"]))
    assert ports[0] != derived and all(15000 <= p < 32768 for p in ports), (ports, derived)
