"""Python mode gets what script mode's template gives a job: its own checkpoint directory and
the node's NCCL profile. Two plain Python-mode jobs submitted from the same directory each save 4
checkpoints with save_atomic's keep-last-3 pruning; each keeps its own newest 3 and its own
`.gpuhpc-latest` (without GPUHPC_CHECKPOINT_DIR both wrote ./checkpoints and pruned each other's).
On the shared cluster's cpu partition; each job runs a second."""
from __future__ import annotations

import os
import sys

from jobs_helpers import HERE

sys.path.insert(0, str(HERE))
from jobs_counter_lib import save_checkpoints  # noqa: E402


def test_two_python_jobs_from_one_directory_keep_their_own_checkpoints(jobs_env, tmp_path, track, monkeypatch):
    import gpuhpc

    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{sys.path[0]}")
    profile = tmp_path / "nccl.env"
    profile.write_text('export NCCL_IB_HCA="${NCCL_IB_HCA-=mlx5_0:1}"\n')
    monkeypatch.setenv("GPUHPC_NCCL_PROFILE", str(profile))
    for k in ("NCCL_IB_HCA", "GPUHPC_CHECKPOINT_DIR", "GPUHPC_COLLECTIVE_TIMEOUT_S", "GPUHPC_STOP_COLLECTIVE_TIMEOUT_S"):
        monkeypatch.delenv(k, raising=False)
    res = gpuhpc.Resources(partition="cpu", time="5m")
    jobs = {tag: gpuhpc.submit(save_checkpoints, tag, 4, resources=res, name=f"gpuhpc-test-pyckpt-{tag}", grace=60)
            for tag in ("a", "b")}
    for job in jobs.values():
        track(job.job_id)
    out = {tag: job.result(timeout=120) for tag, job in jobs.items()}

    dirs = {tag: o["dir"] for tag, o in out.items()}
    assert dirs["a"] != dirs["b"], dirs
    for tag, job in jobs.items():
        d = dirs[tag]
        assert job.job_id in d and not d.startswith(str(workdir)), d      # per job, not ./checkpoints
        assert sorted(n for n in os.listdir(d) if not n.startswith(".")) == [f"{tag}-2", f"{tag}-3", f"{tag}-4"]
        assert os.readlink(os.path.join(d, ".gpuhpc-latest")) == f"{tag}-4"
        assert out[tag]["NCCL_IB_HCA"] == "=mlx5_0:1"                       # the node's profile
        assert (out[tag]["GPUHPC_COLLECTIVE_TIMEOUT_S"], out[tag]["GPUHPC_STOP_COLLECTIVE_TIMEOUT_S"]) == ("600", "45")
    assert not (workdir / "checkpoints").exists()
