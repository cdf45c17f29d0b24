"""A real torch DCP save cut off at the deadline is never resumed from (issue 32.8), and a
complete one loads on another world size. torch_dcp_train.py (Debian's torch 1.13 on CPU, gloo,
two rank processes; torch_compat) saves ``step-10`` with DCP, is warned (SIGUSR2 to the batch
shell: the template's stop path) and its next save is cut off before the coordinator's
``.metadata``: in a new directory (``step-20``: both ranks' ``.distcp`` files, no ``.metadata``)
or over ``step-10`` itself (its ``.distcp`` files newer than its ``.metadata``). The requeued run
gets the newest complete save as ``$GPUHPC_LATEST_CHECKPOINT`` (gpuhpc.jobs.ckpt_formats' DCP
rule) and loads it with DCP in one process (world size 1; it was saved by 2). On the shared
cluster's cpu partition, as test_checkpoint_formats.py."""
from __future__ import annotations

import json

import pytest

from jobs_helpers import HERE, gpuhpc, job_state
from polling import wait_for
from torch_compat import TORCH_PYTHON, require_torch

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cut, resumed", [("step-20", "step-10"), ("step-10", "step-05")],
                         ids=["new-dir-without-metadata", "distcp-newer-than-metadata"])
def test_a_dcp_save_cut_off_at_the_deadline_is_not_resumed_from(jobs_env, tmp_path, slurm, track, cut, resumed):
    require_torch()
    progress = tmp_path / "progress"
    args = [str(progress)] + (["--stale"] if cut == "step-10" else [])
    res = gpuhpc("submit", "--partition", "cpu", "--time", "5m", "--max-requeues", "2",
                 "--name", "gpuhpc-test-torch-dcp", "--json", "--",
                 TORCH_PYTHON, str(HERE / "torch_dcp_train.py"), *args)
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)

    def line(prefix: str):
        def check():
            if not progress.exists():
                return None
            return next((x for x in progress.read_text().splitlines() if x.startswith(prefix)), None)
        return check

    def job_log() -> str:
        from gpuhpc.jobs.api import Job

        return Job(job_id, client=slurm).logs()[-3000:]

    saved = wait_for(line("saved "), 120, lambda: f"job {job_id} to save with DCP: {job_log()}")
    ckdir = saved.split(" ", 1)[1].rsplit("/", 1)[0]
    wait_for(line(f"saved {ckdir}/step-10"), 60, f"job {job_id} to save step-10")
    slurm.run(["scancel", "--signal=USR2", "--batch", job_id])   # the warning a preemption or the time limit sends
    wait_for(line("start 1 "), 150, lambda: f"job {job_id} to be requeued and start again: {job_log()}")
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED"), 90, f"job {job_id} to end")

    lines = progress.read_text().splitlines()
    assert job_state(slurm, job_id) == "COMPLETED", (lines, job_log())
    cut_line = next(x for x in lines if x.startswith("cut "))
    files = cut_line.split()[2:]
    assert cut_line.split()[1] == f"{ckdir}/{cut}", lines
    # both ranks wrote their part: the save was cut off only at the coordinator's .metadata
    assert any(f.startswith("__0_") for f in files) and any(f.startswith("__1_") for f in files), lines
    assert all(f.endswith(".distcp") or f == ".metadata" for f in files), lines
    assert (".metadata" in files) == (cut == "step-10"), lines
    assert f"start 1 {ckdir}/{resumed}" in lines, lines                  # the newest complete save
    step = int(resumed.split("-")[1])
    assert f"loaded {ckdir}/{resumed} {step} ok" in lines, lines         # loaded on world size 1
