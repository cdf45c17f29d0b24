"""A framework's save cut off at the warning is never resumed from (issue 32.8): a job saves a
complete Hugging Face Trainer checkpoint (``checkpoint-10/``, ``trainer_state.json`` last), is
warned as a preemption or the time limit warns it (SIGUSR2 to the batch shell: the template's
stop path), and its next save is cut off (``checkpoint-20/`` with the weights, no
``trainer_state.json``); the requeued run gets ``checkpoint-10`` as ``$GPUHPC_LATEST_CHECKPOINT``,
though ``checkpoint-20`` is newer. On the shared cluster's cpu partition; the job runs two short
runs (the requeue waits out cred_expire)."""
from __future__ import annotations

import json
import sys

from jobs_helpers import gpuhpc, job_state
from polling import wait_for

PROGRAM = r'''
import json, os, sys, time
from pathlib import Path
from gpuhpc.jobs import checkpoint as ck

def trainer_save(step, finished):
    d = ck.checkpoint_dir() / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (d / name).write_bytes(b"x" * 1024)
    if finished:                        # the Trainer writes trainer_state.json last
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))

ck.install_signal_handler()
log = open(sys.argv[1], "a", buffering=1)
log.write(f"start {ck.restart_count()} {os.environ.get('GPUHPC_LATEST_CHECKPOINT', '')}\n")
if ck.restart_count() == 0:
    trainer_save(10, True)
    log.write(f"saved {ck.checkpoint_dir()}\n")
    while not ck.stop_requested():
        time.sleep(0.1)
    trainer_save(20, False)             # cut off: the deadline came before trainer_state.json
    log.write("cut 20\n")
'''


def test_a_trainer_save_cut_off_at_the_warning_is_not_resumed_from(jobs_env, tmp_path, slurm, track):
    progress, script = tmp_path / "progress", tmp_path / "train.py"
    script.write_text(PROGRAM)
    res = gpuhpc("submit", "--partition", "cpu", "--time", "5m", "--max-requeues", "2",
                 "--name", "gpuhpc-test-ckpt-formats", "--json", "--",
                 sys.executable, str(script), str(progress))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)

    def line(prefix: str):
        def check():
            if not progress.exists():
                return None
            return next((x for x in progress.read_text().splitlines() if x.startswith(prefix)), None)
        return check

    saved = wait_for(line("saved "), 90, f"job {job_id} to save checkpoint-10")
    ckdir = saved.split(" ", 1)[1]
    slurm.run(["scancel", "--signal=USR2", "--batch", job_id])   # the warning a preemption or the time limit sends
    wait_for(line("start 1 "), 120, f"job {job_id} to be requeued and start again")
    wait_for(lambda: job_state(slurm, job_id) == "COMPLETED", 60, f"job {job_id} to complete")

    lines = progress.read_text().splitlines()
    assert "cut 20" in lines, lines
    assert f"start 1 {ckdir}/checkpoint-10" in lines, lines          # not checkpoint-20, the newer cut-off one
