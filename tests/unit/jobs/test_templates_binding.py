"""The deepspeed template starts its tasks as DeepSpeed's launcher does: LOCAL_RANK is the task's
place on its node (0..n-1) and every task sees all of the node's GPUs (no --gpu-bind), so
cuda:LOCAL_RANK is its own GPU; GPUHPC_GPU_BIND passes a binding anyway. Fake srun and scontrol;
no Slurm needed. The real cluster: tests/integration/jobs/test_deepspeed_local_rank.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources

# srun stand-in: logs its options, then runs the task command once per local task with the
# environment Slurm gives a task (one GPU each under --gpu-bind=single:1, else all of them)
SRUN = r"""#!/bin/bash
opts=()
while [ "$1" != bash ]; do opts+=("$1"); shift; done
printf '%s\n' "${opts[*]}" > "$FAKE_DIR/srun.opts"
n=${SLURM_NTASKS_PER_NODE:-1}
for ((i = 0; i < n; i++)); do
  cvd=$(seq -s, 0 $((SLURM_GPUS_ON_NODE - 1)))
  case " ${opts[*]} " in *" --gpu-bind=single:1 "*) cvd=$i;; esac
  SLURM_LOCALID=$i SLURM_PROCID=$i SLURM_NTASKS=$n CUDA_VISIBLE_DEVICES=$cvd "$@" &
done
wait
"""
SCONTROL = r"""#!/bin/bash
case "$*" in
  "show hostnames"*) echo node1 ;;
  *"show node"*) echo "NodeName=node1 Arch=x86_64 NodeAddr=10.0.0.1 $FAKE_GRES State=IDLE" ;;
esac
"""
PROGRAM = ("import json, os, sys; keys = ('RANK', 'LOCAL_RANK', 'GPUHPC_LOCAL_RANK', 'LOCAL_WORLD_SIZE', "
           "'CUDA_VISIBLE_DEVICES', 'NDEV_PER_NODE'); "
           "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(json.dumps({k: os.environ.get(k) "
           "for k in keys}))")


def _run(tmp_path: Path, *, gpus: int, tasks: int, gres: str, env: dict[str, str] | None = None):
    bindir, out = tmp_path / "bin", tmp_path / "out"
    bindir.mkdir()
    out.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    spec = JobSpec(command=(sys.executable, "-c", PROGRAM, str(out)), template="deepspeed",
                   resources=Resources(nodes=1, gpus=gpus, gpu_type="h100", tasks_per_node=tasks),
                   checkpoint_dir=str(tmp_path / "ck"))
    (tmp_path / "job.sh").write_text(render(spec))
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
                              "SLURM_JOB_NODELIST": "node1", "SLURM_NTASKS": str(tasks),
                              "SLURM_NTASKS_PER_NODE": str(tasks), "SLURM_GPUS_ON_NODE": str(gpus),
                              "SLURM_CPUS_ON_NODE": "16", "FAKE_DIR": str(tmp_path), "FAKE_GRES": gres,
                              "GPUHPC_PYTHON": sys.executable, **(env or {})})
    assert res.returncode == 0, res.stderr
    ranks = {int(p.name): json.loads(p.read_text()) for p in out.iterdir()}
    return (tmp_path / "srun.opts").read_text().split(), ranks, res.stderr


@pytest.mark.parametrize("gres", ["Gres=gpu:h100:8(S:0-1)", "Gres=gpu:h100:8"])
def test_local_rank_is_the_node_local_rank_and_every_task_sees_the_nodes_gpus(tmp_path, gres):
    opts, ranks, log = _run(tmp_path, gpus=8, tasks=8, gres=gres)
    assert not any(o.startswith(("--gpu-bind", "--cpu-bind")) for o in opts) and "--cpus-per-task=2" in opts
    assert sorted(ranks) == list(range(8))
    assert [ranks[r]["LOCAL_RANK"] for r in range(8)] == [str(r) for r in range(8)]   # cuda:LOCAL_RANK
    assert [ranks[r]["GPUHPC_LOCAL_RANK"] for r in range(8)] == [str(r) for r in range(8)]
    assert {ranks[r]["CUDA_VISIBLE_DEVICES"] for r in range(8)} == {"0,1,2,3,4,5,6,7"}
    assert {ranks[r]["LOCAL_WORLD_SIZE"] for r in range(8)} == {"8"}
    assert {ranks[r]["NDEV_PER_NODE"] for r in range(8)} == {None}        # device_count() is right
    assert "(no binding)" in log


def test_a_binding_only_when_the_user_asks(tmp_path):
    opts, ranks, _ = _run(tmp_path, gpus=4, tasks=4, gres="Gres=gpu:h100:8", env={"GPUHPC_GPU_BIND": "single:1"})
    assert "--gpu-bind=single:1" in opts
    assert [ranks[r]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("template", ["single", "torchrun", "mpi"])
def test_other_templates_bind_no_gpus(template):
    text = render(JobSpec(command=("python", "train.py"), template=template,
                          resources=Resources(nodes=1, gpus=4, gpu_type="h100")))
    launch = text[text.index("# ---------------------------------------------------------------- the program"):]
    assert "--gpu-bind" not in launch and "_gpuhpc_task_binding" not in launch
