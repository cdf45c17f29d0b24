"""Run the rendered single template under bash with a fake Slurm environment: the USR2
trap forwards to the program, then requeues via `scontrol requeue` (a stub that records
its arguments); the restart cap; checkpoint env; scratch cleanup. No Slurm needed."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from polling import wait_for

PROGRAM = r"""
import os, signal, sys, time
from gpuhpc.jobs import checkpoint as ckpt
ckpt.install_signal_handler()
out = sys.argv[1]
with open(out, "w") as fh:
    fh.write(" ".join([os.environ["GPUHPC_RESTART_COUNT"], os.environ["GPUHPC_LATEST_CHECKPOINT"] or "-",
                       os.environ["GPUHPC_SCRATCH"]]) + "\n")
open(out + ".ready", "w").close()
while not ckpt.stop_requested():
    time.sleep(0.05)
if not os.environ.get("NO_SAVE"):
    local = os.path.join(ckpt.scratch_dir(), "step-7.txt")
    open(local, "w").write("7")
    ckpt.save_atomic(local)
sys.exit(0)
"""


def _mutations(scontrol_log: str) -> list[str]:
    """The scontrol calls that change something (the template also reads `show job`)."""
    return [line for line in scontrol_log.splitlines() if " show " not in f" {line} "]


def _wait_ready(ready: Path, proc: subprocess.Popen) -> None:
    """Until the program wrote ``ready``; fails at once when the job script has exited."""
    wait_for(ready.exists, 15, f"the program to write {ready.name}", interval=0.05,
             abort=lambda: proc.poll() is not None and f"the job script exited ({proc.returncode})")


def _job(tmp_path: Path, job_id: str, restart: int, out: Path, **spec_kw):
    """The rendered single-template job running PROGRAM, its environment, and the log of the
    `scontrol` stub (it records its arguments)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    log = tmp_path / "scontrol.log"
    (bindir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bindir / "scontrol").chmod(0o755)
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    spec = JobSpec(command=(sys.executable, str(prog), str(out)), checkpoint_dir=str(tmp_path / "ck" / "%j"),
                   resources=Resources(time="1h"), grace=20, **spec_kw)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID=job_id,
               SLURM_RESTART_COUNT=str(restart), GPUHPC_SCRATCH_ROOT=str(tmp_path / "scratch"))
    return render(spec), env, log


def _run(tmp_path: Path, restart: int, max_requeues: int = 3, send_signal: bool = True, **env_kw: str):
    out = tmp_path / f"out-{restart}.txt"
    text, env, log = _job(tmp_path, "4242", restart, out, max_requeues=max_requeues)
    env.update(env_kw)
    script = tmp_path / "job.sh"
    script.write_text(text)
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _wait_ready(Path(str(out) + ".ready"), proc)
    if send_signal:
        proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=20)
    return proc.returncode, out.read_text().split(), (log.read_text() if log.exists() else ""), err


def test_usr2_is_forwarded_and_the_job_requeues_itself(tmp_path):
    rc, seen, scontrol, err = _run(tmp_path, restart=0)
    assert rc == 0, err
    assert seen[0] == "0" and seen[1] == "-"
    assert _mutations(scontrol) == ["requeue 4242"]
    ck = tmp_path / "ck" / "4242"
    assert (ck / "step-7.txt").read_text() == "7" and os.readlink(ck / ".gpuhpc-latest") == "step-7.txt"
    assert not [p for p in ck.iterdir() if p.name.startswith(".") and p.name not in (".gpuhpc-latest", ".gpuhpc-saved")]
    assert not Path(seen[2]).exists()                                    # scratch cleaned at exit
    # the restarted run sees the restart count and the latest checkpoint
    rc, seen, _, err = _run(tmp_path, restart=1)
    assert seen[0] == "1" and seen[1] == str(ck / "step-7.txt")


def test_usr2_before_the_handlers_exist_still_requeues(tmp_path):
    """A preemption in the job's first moments: SIGUSR2 arrives while the script is still in its
    user environment lines (here: a slow one). It is remembered and handled once the handlers
    exist: the job requeues itself instead of dying unrequeued with signal 12 (it had no
    progress to save; the restart resumes from the previous checkpoint)."""
    text, env, log = _job(tmp_path, "4343", 0, tmp_path / "out.txt", max_requeues=3, env={"SLOW": "$(sleep 1)"})
    inside = tmp_path / "inside-env-line"
    slow = f"touch {inside}; sleep 2; export SLOW="                     # a slow first line
    text = text.replace("export SLOW=", slow, 1)
    assert slow in text
    script = tmp_path / "job.sh"
    script.write_text(text)
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_ready(inside, proc)                        # inside the slow environment line
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert _mutations(log.read_text()) == ["requeue 4343"], err
    assert "SIGUSR2 (preemption or time limit)" in err


def test_requeue_cap_is_a_failure(tmp_path):
    # the program exited 0 after the warning, but the job is not requeued (3 runs already ended
    # without progress, and this one saved nothing either): its work is unfinished, so the job
    # must not end COMPLETED (a sweep would take the mid-training metric)
    (tmp_path / "ck" / "4242").mkdir(parents=True)
    (tmp_path / "ck" / "4242" / ".gpuhpc-requeues.4242").write_text("3 0\n")
    rc, _, scontrol, err = _run(tmp_path, restart=3, max_requeues=3, NO_SAVE="1")
    assert "requeue 4242" not in scontrol
    assert "JobId=4242 Requeue=0" in scontrol
    assert rc == 75 and "requeue cap reached" in err, err


def test_a_failed_requeue_is_a_failure(tmp_path):
    text, env, log = _job(tmp_path, "4244", 0, tmp_path / "out-0.txt", max_requeues=3)
    (tmp_path / "bin" / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" != requeue ]\n')
    script = tmp_path / "job.sh"
    script.write_text(text)
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_ready(tmp_path / "out-0.txt.ready", proc)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 75 and "requeue failed" in err, err


def test_shell_save_helper_is_atomic_and_exported(tmp_path):
    spec = JobSpec(command=("bash", "-c", 'echo 1 > "$GPUHPC_SCRATCH/c.bin"; gpuhpc_save_checkpoint "$GPUHPC_SCRATCH/c.bin"; '
                                          'mkdir -p "$GPUHPC_SCRATCH/d"; echo 2 > "$GPUHPC_SCRATCH/d/x"; '
                                          'gpuhpc_save_checkpoint "$GPUHPC_SCRATCH/d" ckpt-dir'),
                   checkpoint_dir=str(tmp_path / "ck"))
    script = tmp_path / "job.sh"
    script.write_text(render(spec))
    env = dict(os.environ, SLURM_JOB_ID="7", GPUHPC_SCRATCH_ROOT=str(tmp_path / "s"))
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    ck = tmp_path / "ck"
    assert (ck / "c.bin").read_text() == "1\n" and (ck / "ckpt-dir" / "x").read_text() == "2\n"
    assert os.readlink(ck / ".gpuhpc-latest") == "ckpt-dir"
    assert sorted(p.name for p in ck.iterdir()) == [".gpuhpc-latest", ".gpuhpc-saved", "c.bin", "ckpt-dir"]
    assert not (tmp_path / "s" / "gpuhpc-7").exists()


@pytest.mark.parametrize("exit_code", [0, 3])
def test_exit_code_passes_through_without_signal(tmp_path, exit_code):
    spec = JobSpec(command=(sys.executable, "-c", f"raise SystemExit({exit_code})"),
                   checkpoint_dir=str(tmp_path / "ck"))
    script = tmp_path / "job.sh"
    script.write_text(render(spec))
    res = subprocess.run(["bash", str(script)], env=dict(os.environ, SLURM_JOB_ID="8"),
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == exit_code, res.stderr


def test_program_that_ignores_usr2_is_requeued_after_the_grace_budget(tmp_path):
    """The program goes on stepping after the warning (it records it, then ignores it): the job
    script gives it the budget its --grace allows, then requeues the job without waiting for
    the program's own end."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "scontrol.log"
    (bindir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bindir / "scontrol").chmod(0o755)
    ready, steps = tmp_path / "ready", tmp_path / "steps"
    prog = (f"import signal, time\n"
            f"def note(word):\n    with open({str(steps)!r}, 'a') as fh: fh.write(word + '\\n')\n"
            f"signal.signal(signal.SIGUSR2, lambda *a: note('usr2'))\n"
            f"open({str(ready)!r}, 'w').close()\n"
            f"for _ in range(300):\n    time.sleep(0.1); note('step')\n"
            f"note('end')\n")
    (tmp_path / "prog.py").write_text(prog)
    spec = JobSpec(command=(sys.executable, str(tmp_path / "prog.py")), grace=4, checkpoint_dir=str(tmp_path / "ck"))
    script = tmp_path / "job.sh"
    script.write_text(render(spec))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="9")
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.DEVNULL, stderr=err)
        _wait_ready(ready, proc)
        proc.send_signal(signal.SIGUSR2)
        proc.wait(timeout=15)
    seen = steps.read_text().split()
    text = (tmp_path / "err").read_text()
    assert re.search(r"\([34]s\): the program has 3s to checkpoint and exit", text), text   # --grace 4's budget
    assert "usr2" in seen and "step" in seen[seen.index("usr2") + 1:], seen    # it stepped on after the warning
    assert "end" not in seen, seen                                             # requeued before its own end
    assert _mutations(log.read_text()) == ["requeue 9"]
    assert "did not exit by the deadline" in text


def test_sigterm_is_forwarded_and_the_program_may_finish_its_checkpoint(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "scontrol.log"
    (bindir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bindir / "scontrol").chmod(0o755)
    ready, saved = tmp_path / "ready", tmp_path / "saved"
    prog = (f"import signal, time, sys\n"
            f"def term(*a):\n    time.sleep(0.5); open({str(saved)!r}, 'w').close(); sys.exit(0)\n"
            f"signal.signal(signal.SIGTERM, term)\nopen({str(ready)!r}, 'w').close()\ntime.sleep(30)\n")
    (tmp_path / "prog.py").write_text(prog)
    spec = JobSpec(command=(sys.executable, str(tmp_path / "prog.py")), checkpoint_dir=str(tmp_path / "ck"))
    script = tmp_path / "job.sh"
    script.write_text(render(spec))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="10")
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    _wait_ready(ready, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 143 and saved.exists(), err
    assert not log.exists()              # no self-requeue on SIGTERM: Slurm does it
