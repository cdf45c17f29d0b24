"""The requeue cap counts runs without progress, not preemptions: the rendered template, run
under bash with a stub scontrol (it records its calls and serves a `show job` line with
PreemptTime set for a preemption, None for the time limit). Progress is a newer complete
checkpoint than the run started from; a run that made it is requeued past --max-requeues, a
time limit without it counts against --max-requeues, a preemption without it against the higher
GPUHPC_MAX_PREEMPT_REQUEUES (5 x --max-requeues). The counts live in the checkpoint dir."""
from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from polling import wait_for

STUB = r"""#!/bin/sh
echo "$@" >> {log}
case "$*" in
  "--oneliner show job "*) cat {job} ;;
esac
"""

PROGRAM = r"""
import os, sys, time
from gpuhpc.jobs import checkpoint as ckpt
ckpt.install_signal_handler()
open(sys.argv[1], "w").close()
while not ckpt.stop_requested():
    time.sleep(0.05)
if os.environ.get("SAVE"):
    ckpt.save_atomic(os.environ["SAVE"].encode(), os.environ["SAVE"])
sys.exit(0)
"""


def _iso(offset_s: float) -> str:
    return (datetime.datetime.now() + datetime.timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%S")


def _run(tmp_path: Path, *, restart: int, preempted: bool, save: str = "", stalls: str | None = None,
         max_requeues: int = 2, extra_env: dict | None = None):
    """One run of job 5151; returns (exit code, scontrol mutations, stderr, the stall counts after)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    log, job = tmp_path / "scontrol.log", tmp_path / "job.txt"
    log.unlink(missing_ok=True)
    job.write_text(f"JobId=5151 JobState=RUNNING Requeue=1 Restarts={restart} EndTime={_iso(40)} "
                   f"PreemptTime={_iso(0) if preempted else 'None'} Partition=gpu\n")
    (bindir / "scontrol").write_text(STUB.format(log=log, job=job))
    (bindir / "scontrol").chmod(0o755)
    ck = tmp_path / "ck"
    ck.mkdir(exist_ok=True)
    counts = ck / ".gpuhpc-requeues.5151"
    if stalls is not None:
        counts.write_text(stalls + "\n")
    prog, ready = tmp_path / "prog.py", tmp_path / "ready"
    prog.write_text(PROGRAM)
    ready.unlink(missing_ok=True)
    spec = JobSpec(command=(sys.executable, str(prog), str(ready)), grace=30, checkpoint_dir=str(ck),
                   max_requeues=max_requeues, resources=Resources(time="1h"))
    (tmp_path / "job.sh").write_text(render(spec))
    env = dict({k: v for k, v in os.environ.items() if k != "GPUHPC_MAX_PREEMPT_REQUEUES"}, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="5151",
               SLURM_RESTART_COUNT=str(restart), SAVE=save, GPUHPC_SCRATCH_ROOT=str(tmp_path / "scratch"),
               **(extra_env or {}))
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wait_for(ready.exists, 15, "the program to start", interval=0.05,
             abort=lambda: proc.poll() is not None and f"the job script exited: {proc.communicate()}")
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=30)
    mutations = [line for line in log.read_text().splitlines() if " show " not in f" {line} "]
    return proc.returncode, mutations, err, (counts.read_text().split() if counts.exists() else None)


def test_preemptions_with_progress_are_requeued_past_the_cap(tmp_path):
    """--max-requeues 2; the job has been requeued 6 times already, each run saved a checkpoint
    (the counts are 0 0): a seventh preemption with progress is requeued, and not counted."""
    for restart, name in enumerate(["c1", "c2", "c3", "c4", "c5", "c6", "c7"]):
        rc, mutations, err, counts = _run(tmp_path, restart=restart, preempted=True, save=name)
        assert (rc, mutations) == (0, ["requeue 5151"]), err
        assert counts is None and "progress" in err, err


def test_the_same_name_saved_again_is_progress(tmp_path):
    """A time limit after --max-requeues 2 runs without progress: saving `model` again (a new
    file under the same name) is progress all the same."""
    _run(tmp_path, restart=5, preempted=False, save="model", stalls="2 0")      # requeued: progress
    rc, mutations, err, counts = _run(tmp_path, restart=6, preempted=False, save="model", stalls="2 0")
    assert (rc, mutations, counts) == (0, ["requeue 5151"], ["2", "0"]), err


def test_a_time_limit_without_progress_counts_against_max_requeues(tmp_path):
    rc, mutations, err, counts = _run(tmp_path, restart=0, preempted=False, stalls="1 4")
    assert (rc, mutations, counts) == (0, ["requeue 5151"], ["2", "4"]), err
    rc, mutations, err, counts = _run(tmp_path, restart=1, preempted=False)
    assert rc == 75 and "requeue 5151" not in mutations and "update JobId=5151 Requeue=0" in mutations, err
    assert "requeue cap reached: already requeued 2 times without progress" in err
    assert counts == ["2", "4"]


def test_a_preemption_without_progress_counts_against_the_higher_cap(tmp_path):
    """--max-requeues 2 is spent (2 0): a preemption without progress is still requeued, up to
    5 x 2 = 10 of them; the eleventh ends the job."""
    rc, mutations, err, counts = _run(tmp_path, restart=5, preempted=True, stalls="2 9")
    assert (rc, mutations, counts) == (0, ["requeue 5151"], ["2", "10"]), err
    assert "preempted without progress: 10 of at most 10" in err
    rc, mutations, err, counts = _run(tmp_path, restart=6, preempted=True)
    assert rc == 75 and "requeue 5151" not in mutations, err
    assert "requeue cap reached: preempted without progress 10 times (at most 10)" in err


def test_the_preemption_cap_is_a_setting(tmp_path):
    rc, _, err, _ = _run(tmp_path, restart=5, preempted=True, stalls="0 3",
                         extra_env={"GPUHPC_MAX_PREEMPT_REQUEUES": "3"})
    assert rc == 75 and "at most 3" in err, err


@pytest.mark.parametrize("save", ["", "c1"])
def test_max_requeues_0_never_requeues(tmp_path, save):
    rc, mutations, err, _ = _run(tmp_path, restart=0, preempted=True, save=save, max_requeues=0)
    assert rc == 75 and "requeue 5151" not in mutations and "never requeued" in err, err


def test_a_bad_preemption_cap_falls_back_to_5x(tmp_path):
    rc, mutations, err, counts = _run(tmp_path, restart=5, preempted=True, stalls="0 9",
                                      extra_env={"GPUHPC_MAX_PREEMPT_REQUEUES": "lots"})
    assert (rc, mutations, counts) == (0, ["requeue 5151"], ["0", "10"]), err
