"""The requeue timer follows the job's real deadline (EndTime; PreemptTime + the partition's
GraceTime), read from a stub scontrol, not `--grace - 10`: a long save inside the deadline is
not cut short, and a job past its deadline is requeued before Slurm's kill."""
from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources

STUB = r"""#!/bin/sh
echo "$@" >> {log}
case "$*" in
  "--oneliner show job "*) cat {job} ;;
  "--oneliner show partition "*) cat {part} ;;
esac
"""


def _iso(offset_s: float) -> str:
    return (datetime.datetime.now() + datetime.timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%S")


def _job(tmp_path: Path, program: str, *, end_in: float, preempted: bool, grace_time: int, grace: int = 60):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log, job, part = tmp_path / "scontrol.log", tmp_path / "job.txt", tmp_path / "part.txt"
    job.write_text(f"JobId=11 JobState=RUNNING Partition=gpu EndTime={_iso(end_in)} "
                   f"PreemptTime={_iso(0) if preempted else 'None'} SuspendTime=None\n")
    part.write_text(f"PartitionName=gpu GraceTime={grace_time} PreemptMode=REQUEUE\n")
    (bindir / "scontrol").write_text(STUB.format(log=log, job=job, part=part))
    (bindir / "scontrol").chmod(0o755)
    ready = tmp_path / "ready"
    prog = tmp_path / "prog.py"
    prog.write_text(program.replace("READY", repr(str(ready))))
    spec = JobSpec(command=(sys.executable, str(prog)), grace=grace, checkpoint_dir=str(tmp_path / "ck"),
                   resources=Resources(time="1h"))
    (tmp_path / "job.sh").write_text(render(spec))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="11")
    err = open(tmp_path / "err", "w")
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 15
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGUSR2)
    proc.wait(timeout=40)
    err.close()
    requeues = [line for line in log.read_text().splitlines() if line.startswith("requeue")]
    return time.monotonic() - t0, requeues, (tmp_path / "err").read_text()


SLOW_SAVE = """
import signal, sys, time
stop = []
signal.signal(signal.SIGUSR2, lambda *a: stop.append(1))
open(READY, "w").close()
while not stop:
    time.sleep(0.05)
time.sleep(SAVE_S)                       # a long save
open(READY + ".saved", "w").close()
sys.exit(0)
"""

IGNORES = """
import signal, time
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
open(READY, "w").close()
time.sleep(30)
"""


def test_a_save_longer_than_grace_but_inside_the_graceTime_is_not_cut(tmp_path):
    # --grace 4 used to requeue 3 s after the signal; the preemption deadline is 30 s away
    took, requeues, err = _job(tmp_path, SLOW_SAVE.replace("SAVE_S", "6"), end_in=30, preempted=True,
                               grace_time=30, grace=4)
    assert (tmp_path / "ready.saved").exists(), err
    assert took >= 6 and requeues == ["requeue 11"], (took, err)
    assert "program exited (0) after SIGUSR2" in err


def test_the_deadline_is_preempt_time_plus_grace_time(tmp_path):
    took, requeues, err = _job(tmp_path, SLOW_SAVE.replace("SAVE_S", "0"), end_in=300, preempted=True,
                               grace_time=300)
    m = re.search(r"deadline \S+ \((\d+)s\): the program has (\d+)s", err)
    assert m and 298 <= int(m.group(1)) <= 300 and 293 <= int(m.group(2)) <= 295, err
    assert requeues == ["requeue 11"]


def test_the_shorter_of_end_time_and_grace_time_wins(tmp_path):
    took, requeues, err = _job(tmp_path, IGNORES, end_in=600, preempted=True, grace_time=6)
    assert 3 <= took < 9, (took, err)
    assert "did not exit by the deadline" in err and requeues == ["requeue 11"]


def test_at_the_time_limit_the_deadline_is_end_time(tmp_path):
    # the time-limit warning: no PreemptTime, EndTime 8 s away although --grace is 60
    took, requeues, err = _job(tmp_path, IGNORES, end_in=8, preempted=False, grace_time=30)
    assert 4 <= took < 11, (took, err)
    assert requeues == ["requeue 11"]
