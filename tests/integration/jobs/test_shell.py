"""Issue 33.8 on the local cluster: ``gpuhpc shell --gpus 1 --partition gpu -- sh`` driven through a
pseudo-terminal (python's pty module): the shell runs inside an allocation holding one GPU, on a
terminal, and the allocation is gone once the shell exits; in a two-node shell a plain srun runs
on both nodes; a hostile job name and command word
reach Slurm as one argument each (nothing of them is run); a shell no node can hold is refused
(exit 2) with nothing allocated; over SSH (laptop mode, the local sshd) salloc gets a pty on the
login node."""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs_helpers import gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
HOSTILE_NAME = "h13 $(touch PWNED-name); `touch PWNED-tick` | & > x \"q\" 'q' *"
HOSTILE_WORD = "w $(touch PWNED-cmd); `touch PWNED-cmd2` && touch PWNED-cmd3 \"$HOME\" *"


class Terminal:
    """``argv`` on the slave side of a new pty (its controlling terminal), from ``cwd``; what it
    writes is collected from the master side."""

    def __init__(self, argv: list[str], cwd, env: dict[str, str] | None = None) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:               # the child: never returns into pytest
            try:
                os.chdir(cwd)
                os.execve(argv[0], argv, {**os.environ, **(env or {})})
            finally:
                os._exit(127)
        self.out = b""
        self.status: int | None = None

    def _read(self) -> bytes:
        while select.select([self.fd], [], [], 0.05)[0]:
            try:
                data = os.read(self.fd, 65536)
            except OSError:             # EIO: the child side is closed
                data = b""
            if not data:
                break
            self.out += data
        return self.out

    def _exited(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def expect(self, pattern: bytes, timeout: float, what: str) -> re.Match:
        return wait_for(lambda: re.search(pattern, self._read()), timeout, what, interval=0.05,
                        abort=lambda: self._exited() and not re.search(pattern, self._read())
                        and f"gpuhpc shell exited ({self.status}); output: {self.out[-2000:]!r}")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float) -> int:
        wait_for(lambda: self._read() is not None and self._exited(), timeout, "gpuhpc shell to exit", interval=0.05)
        self._read()
        return self.status

    def close(self) -> None:
        if not self._exited():
            os.kill(self.pid, signal.SIGHUP)
            wait_for(self._exited, 30, "gpuhpc shell to end on SIGHUP")
        os.close(self.fd)


def _shell(tmp_path, *args: str, env: dict[str, str] | None = None) -> Terminal:
    return Terminal([sys.executable, "-m", "gpuhpc", "shell", *args], tmp_path, env)


def test_shell_runs_on_a_terminal_in_a_one_gpu_allocation_that_ends_with_it(jobs_env, tmp_path, slurm, track):
    term = _shell(tmp_path, "--gpus", "1", "--partition", "gpu", "--time", "5", "--", "sh")
    try:
        job_id = term.expect(rb"salloc: Granted job allocation (\d+)", 60, "salloc's allocation").group(1).decode()
        track(job_id)
        # the quotes keep the echoed input from matching: only the shell's output does
        term.send('echo "JO""B=$SLURM_JOB_ID STEP=$SLURM_STEP_ID GPUS=$CUDA_VISIBLE_DEVICES '
                  'NODE=$SLURMD_NODENAME"; [ -t 0 ] && [ -t 1 ] && echo "T""TY=yes"\n')
        m = term.expect(rb"JOB=(\d+) STEP=(\d+) GPUS=(\S*) NODE=(\S+)", 60, "the shell's answer")
        assert m.group(1).decode() == job_id and m.group(2) == b"0"       # step 0 of the allocation
        assert len(m.group(3).split(b",")) == 1, m.group(0)               # one GPU in the step
        term.expect(rb"TTY=yes", 10, "a terminal on the shell's stdin and stdout")
        assert job_state(slurm, job_id) == "RUNNING"
        gpus = slurm.job_gpu_indexes(job_id)           # scontrol -d show job: what Slurm allocated
        assert {node: len(idx) for node, idx in gpus.items()} == {m.group(4).decode(): 1}, gpus
        [row] = slurm.queue(job_ids=[job_id])
        assert row.name == "gpuhpc-shell" and row.partition == "gpu"
        term.send("exit 3\n")
        assert term.wait(60) == 3                      # the command's exit status is gpuhpc's
        assert b"Relinquishing job allocation " + job_id.encode() in term.out
    finally:
        term.close()
    # the allocation ended with the shell, not at its time limit
    wait_for(lambda: job_state(slurm, job_id) in ENDED, 30, f"job {job_id} to end")
    assert slurm.active_job_ids([job_id]) == set()


def test_hostile_name_and_command_word_reach_slurm_as_one_argument_each(jobs_env, tmp_path, slurm, track):
    started = time.time()
    out = tmp_path / "word.txt"
    term = _shell(tmp_path, "--gpus", "1", "--partition", "gpu", "--time", "5", "-J", HOSTILE_NAME, "--",
                  "sh", "-c", 'printf "%s" "$1" > "$2"', "sh", HOSTILE_WORD, str(out))
    try:
        job_id = term.expect(rb"salloc: Granted job allocation (\d+)", 60, "salloc's allocation").group(1).decode()
        track(job_id)
        assert term.wait(60) == 0, term.out
    finally:
        term.close()
    assert out.read_text() == HOSTILE_WORD
    assert not list(tmp_path.glob("PWNED*")) and not list(tmp_path.glob("**/PWNED*"))
    import datetime as dt

    since = dt.datetime.fromtimestamp(started - 60)
    assert job_id in wait_for(lambda: slurm.jobs_by_name(HOSTILE_NAME, since), 30,
                              "sacct to know the job by its whole name")


def test_srun_in_a_two_node_shell_runs_on_both_nodes(jobs_env, tmp_path, slurm, track):
    """The job's layout in the shell (--preserve-env): a plain srun there runs a task per node,
    each with its GPU, as in a batch job of the same resources."""
    out = tmp_path / "tasks.txt"
    term = _shell(tmp_path, "--nodes", "2", "--gpus", "1", "--partition", "gpu", "--time", "5", "--", "sh", "-c",
                  'srun sh -c \'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\' > "$1"', "sh", str(out))
    try:
        job_id = term.expect(rb"salloc: Granted job allocation (\d+)", 60, "salloc's allocation").group(1).decode()
        track(job_id)
        assert term.wait(60) == 0, term.out
    finally:
        term.close()
    tasks = sorted(line.split() for line in out.read_text().splitlines())
    assert [node for node, _ in tasks] == ["gpu-node1", "gpu-node2"] and all(len(g.split(",")) == 1 for _, g in tasks)


def test_a_shell_no_node_can_hold_is_refused_and_nothing_is_allocated(jobs_env, tmp_path, slurm):
    import datetime as dt

    since = dt.datetime.now() - dt.timedelta(minutes=1)
    name = f"gpuhpc-test-shell-refused-{time.time_ns()}"      # squeue keeps ended jobs a while: a new name
    res = gpuhpc("shell", "--gpus", "9", "--partition", "gpu", "-J", name, "--", "true", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: gpus: 9 GPUs per node"), res.stderr
    assert slurm.jobs_by_name(name, since) == []


def test_shell_over_ssh_gets_a_terminal_on_the_login_node(jobs_env, tmp_path, slurm, track):
    """Laptop mode: salloc runs on the login node (the local sshd) on the pty the SSH runner asks
    for (paramiko get_pty); the step's output and exit status come back through it."""
    started = subprocess.run(["bash", str(REPO / "scripts/services/sshd.sh"), "start"], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    ssh = dict(kv.split("=", 1) for kv in started.split())
    env = {"GPUHPC_SSH_HOST": ssh["GPUHPC_TEST_SSH_HOST"], "GPUHPC_SSH_KEY": ssh["GPUHPC_TEST_SSH_KEY"],
           "GPUHPC_SSH_KNOWN_HOSTS": ssh["GPUHPC_TEST_SSH_KNOWN_HOSTS"],
           **({"GPUHPC_SSH_SLURM_CONF": os.environ["SLURM_CONF"]} if os.environ.get("SLURM_CONF") else {})}
    term = _shell(tmp_path, "--gpus", "1", "--partition", "gpu", "--time", "5", "--", "sh", "-c",
                  'echo "JOB=$SLURM_JOB_ID GPUS=$CUDA_VISIBLE_DEVICES"; [ -t 0 ] && echo TTY=yes; exit 4', env=env)
    try:
        job_id = term.expect(rb"salloc: Granted job allocation (\d+)", 60, "salloc's allocation").group(1).decode()
        track(job_id)
        m = term.expect(rb"JOB=(\d+) GPUS=(\S*)\r\n", 60, "the step's answer")
        assert m.group(1).decode() == job_id and len(m.group(2).split(b",")) == 1
        term.expect(rb"TTY=yes", 10, "a terminal for the step")
        assert term.wait(60) == 4
    finally:
        term.close()
    wait_for(lambda: job_state(slurm, job_id) in ENDED, 30, f"job {job_id} to end")


def test_the_budget_holds_a_shell_as_a_job(jobs_env, tmp_path, slurm, track, monkeypatch):
    """Over quota: exit 3 and nothing allocated; within it: the worst case (GPUs x time limit) is
    held while the shell runs, tied to the shell's job id."""
    import datetime as dt
    import json
    import sqlite3

    from gpuhpc.ledger.paths import default_db_path
    from jobs_helpers import research_quota

    research_quota(monkeypatch, gpu_hours=1)
    since = dt.datetime.now() - dt.timedelta(minutes=1)
    name = f"gpuhpc-test-shell-quota-big-{time.time_ns()}"     # squeue keeps ended jobs a while: a new name
    big = gpuhpc("shell", "-p", "gpu", "--gpus", "2", "-t", "1h", "-A", "research", "-J", name, "--", "true", cwd=tmp_path)
    assert big.returncode == 3 and big.stderr.startswith("error: quota exceeded"), big.stderr
    assert slurm.jobs_by_name(name, since) == []
    term = _shell(tmp_path, "-p", "gpu", "--gpus", "1", "-t", "15m", "-A", "research", "--", "sh")
    try:
        job_id = term.expect(rb"salloc: Granted job allocation (\d+)", 60, "salloc's allocation").group(1).decode()
        track(job_id)

        def held() -> list:
            with sqlite3.connect(default_db_path()) as db:
                return db.execute("SELECT job_id, status FROM reservations").fetchall()

        assert wait_for(held, 10, "the hold tied to the job") == [(job_id, "submitted")]
        shown = json.loads(gpuhpc("quota", "show", "--json").stdout)
        row = next(q for q in shown if q["account"] == "research" and q["user"] is None)
        assert float(row["held_gpu_hours"]) == pytest.approx(0.25)
        term.send("exit\n")
        assert term.wait(60) == 0
    finally:
        term.close()
