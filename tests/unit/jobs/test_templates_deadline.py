"""The requeue timer follows the job's real deadline, its EndTime (into which Slurm folds the
partition's, the QOS's or a reservation's grace at a preemption), read from a stub scontrol that
serves a `scontrol --oneliner show job` line recorded on the local cluster (times moved to now),
not `--grace - 10`: a long save inside the deadline is not cut short, and a job past its deadline
is requeued before Slurm's kill, with a margin for a busy controller."""
from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from polling import wait_for

STUB = r"""#!/bin/sh
echo "$@" >> {log}
case "$*" in
  "--oneliner show job "*) cat {job} ;;
  "--oneliner show partition "*) cat {part} ;;
esac
"""


def _iso(offset_s: float) -> str:
    return (datetime.datetime.now() + datetime.timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%S")


# `scontrol --oneliner show job` of a running job on the local cluster (Slurm 22.05); the
# tests set EndTime, PreemptTime and Partition
RECORDED = ("JobId=11 JobName=h8-rec UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 "
            "Account=root QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
            "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=00:05:00 TimeMin=N/A "
            "SubmitTime=2026-12-01T11:40:18 EligibleTime=2026-12-01T11:40:18 AccrueTime=2026-12-01T11:40:18 "
            "StartTime=2026-12-01T11:40:19 EndTime={end} Deadline=N/A PreemptEligibleTime=2026-12-01T11:40:19 "
            "PreemptTime={pre} SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T11:40:19 "
            "Scheduler=Main Partition={part} AllocNode:Sid=localhost:9045 ReqNodeList=(null) ExcNodeList=(null) "
            "NodeList=gpu-node1 BatchHost=gpu-node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
            "ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1000M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
            "CoreSpec=* MinCPUsNode=1 MinMemoryCPU=1000M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
            "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/home/alice/run "
            "StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= \n")


def _job(tmp_path: Path, program: str, *, end_in: float, preempted: bool, grace_time: int, grace: int = 60):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log, job, part = tmp_path / "scontrol.log", tmp_path / "job.txt", tmp_path / "part.txt"
    job.write_text(RECORDED.format(end=_iso(end_in), pre=_iso(0) if preempted else "None", part="gpu"))
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
    wait_for(ready.exists, 15, "the program to start", interval=0.05,
             abort=lambda: proc.poll() is not None and f"the job script exited ({proc.returncode})")
    proc.send_signal(signal.SIGUSR2)
    proc.wait(timeout=40)
    err.close()
    requeues = [line for line in log.read_text().splitlines() if line.startswith("requeue")]
    steps = Path(str(ready) + ".steps")
    return requeues, (tmp_path / "err").read_text(), (steps.read_text().split() if steps.exists() else [])


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
import os, signal, time
def note(word):
    with open(READY + ".steps", "a") as fh:
        fh.write(word + "\\n")
signal.signal(signal.SIGUSR2, lambda *a: note("usr2"))     # heard, and ignored
with open(READY, "w") as fh:
    fh.write(str(os.getpid()))
for _ in range(300):
    time.sleep(0.1)
    note("step")
note("end")
"""


def _stepped_on_and_was_cut(steps: list[str]) -> bool:
    """IGNORES went on stepping after the warning, and the job ended before the program did."""
    return "usr2" in steps and "step" in steps[steps.index("usr2") + 1:] and "end" not in steps


def test_a_save_longer_than_grace_but_inside_the_graceTime_is_not_cut(tmp_path):
    # --grace 4 used to requeue 3 s after the signal; the preemption deadline is 30 s away
    requeues, err, _ = _job(tmp_path, SLOW_SAVE.replace("SAVE_S", "6"), end_in=30, preempted=True,
                            grace_time=30, grace=4)
    assert (tmp_path / "ready.saved").exists(), err                # the 6 s save ended before the job did
    assert "program exited (0) after SIGUSR2" in err and "did not exit by the deadline" not in err, err
    assert requeues == ["requeue 11"], err


def _budget(err: str) -> tuple[int, int]:
    m = re.search(r"deadline \S+ \((\d+)s\): the program has (\d+)s", err)
    assert m, err
    return int(m.group(1)), int(m.group(2))


def test_the_deadline_is_end_time_after_a_partition_preemption(tmp_path):
    # preempt/partition_prio: Slurm set EndTime to PreemptTime + the partition's GraceTime (300)
    requeues, err, _ = _job(tmp_path, SLOW_SAVE.replace("SAVE_S", "0"), end_in=300, preempted=True,
                            grace_time=300)
    left, budget = _budget(err)
    assert 298 <= left <= 300 and 273 <= budget <= 275, err        # 10 s + 5 % margin for the requeue
    assert requeues == ["requeue 11"]


def test_a_qos_preemption_gets_the_qos_grace_time_not_the_partitions(tmp_path):
    # preempt/qos: the partition's GraceTime is 0, the QOS's 300 s, and Slurm folded the QOS's into
    # EndTime. The template used to cap the deadline with the partition's GraceTime: about 1 s.
    requeues, err, _ = _job(tmp_path, SLOW_SAVE.replace("SAVE_S", "0"), end_in=300, preempted=True,
                            grace_time=0)
    left, budget = _budget(err)
    assert 298 <= left <= 300 and 273 <= budget <= 275, err
    assert requeues == ["requeue 11"]
    assert not [line for line in (tmp_path / "scontrol.log").read_text().splitlines() if "partition" in line]


def test_a_short_grace_keeps_a_quarter_as_margin(tmp_path):
    requeues, err, steps = _job(tmp_path, IGNORES, end_in=8, preempted=True, grace_time=8)
    left, budget = _budget(err)
    assert 7 <= left <= 8 and 5 <= budget <= 6, err
    assert _stepped_on_and_was_cut(steps), steps
    assert "did not exit by the deadline" in err and requeues == ["requeue 11"]


def test_at_the_time_limit_the_deadline_is_end_time(tmp_path):
    # the time-limit warning: no PreemptTime, EndTime 8 s away although --grace is 60
    requeues, err, steps = _job(tmp_path, IGNORES, end_in=8, preempted=False, grace_time=30)
    left, budget = _budget(err)
    assert 7 <= left <= 8 and 5 <= budget <= 6, err                 # EndTime's 8 s, not --grace's 60
    assert _stepped_on_and_was_cut(steps) and "did not exit by the deadline" in err, (steps, err)
    assert requeues == ["requeue 11"]
    # a program that did not exit by the deadline is stopped, not left running beside the next run
    # (it runs in its own session: under proctrack/linuxproc Slurm's requeue would not find it)
    pid = int((tmp_path / "ready").read_text())
    wait_for(lambda: not _alive(pid), 10, f"the program (pid {pid}) to be stopped after the deadline")
    assert "stopping it (SIGTERM to its process group)" in err, err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:            # a zombie (exited, not yet reaped) is stopped
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_without_an_answer_from_scontrol_the_grace_budget_runs_from_the_signal(tmp_path):
    requeues, err, _ = _job(tmp_path, IGNORES, end_in=-5, preempted=False, grace_time=30, grace=6)
    left, budget = _budget(err)
    assert 5 <= left <= 6 and 4 <= budget <= 5, err
    assert requeues == ["requeue 11"]
