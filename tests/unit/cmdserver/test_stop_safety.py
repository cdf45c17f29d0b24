"""``cmdserver stop`` signals only a verified server: this user's process that holds the flock
of a lock file in this user's private directory (issue 26, point 1)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuhpc.cmdserver.server import running_pid, stop
from gpuhpc.errors import GpuhpcError

# holds an exclusive flock on argv[1] and writes argv[2] (a pid, default its own) into it
_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, (sys.argv[2] if len(sys.argv) > 2 else str(os.getpid())).encode() + b"\\n")
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def rundir(tmp_path):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def spawn(*argv: str, wait_line: bool = False) -> subprocess.Popen:
        p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True)
        started.append(p)
        if wait_line:
            assert p.stdout.readline().strip() == "locked"
        return p

    yield spawn
    for p in started:
        p.kill()
        p.wait()


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def test_a_lock_naming_another_pid_is_not_signalled(rundir, procs):
    victim = procs("sleep", "120")
    procs(sys.executable, "-c", _HOLDER, str(rundir / "cmd-x.lock"), str(victim.pid), wait_line=True)
    sock = str(rundir / "cmd-x.sock")
    assert running_pid(sock) == -1            # held, but not by the pid it names
    assert stop(sock, wait=0.2) is None
    assert _alive(victim)


def test_the_real_holder_is_stopped(rundir, procs):
    holder = procs(sys.executable, "-c", _HOLDER, str(rundir / "cmd-x.lock"), wait_line=True)
    sock = str(rundir / "cmd-x.sock")
    assert running_pid(sock) == holder.pid
    assert stop(sock, wait=10) == holder.pid
    holder.wait(timeout=10)


@pytest.mark.parametrize("how", ["dir-0755", "lock-0666", "lock-symlink"])
def test_a_directory_or_lock_others_could_write_is_refused(rundir, procs, how):
    victim = procs("sleep", "120")
    lock = rundir / "cmd-x.lock"
    if how == "lock-symlink":
        target = rundir / "elsewhere"
        target.write_text(f"{victim.pid}\n")
        lock.symlink_to(target)
    else:
        procs(sys.executable, "-c", _HOLDER, str(lock), str(victim.pid), wait_line=True)
    if how == "dir-0755":
        rundir.chmod(0o755)
    if how == "lock-0666":
        lock.chmod(0o666)
    sock = str(rundir / "cmd-x.sock")
    with pytest.raises(PermissionError):
        running_pid(sock)
    with pytest.raises(GpuhpcError, match="not stopping"):
        stop(sock, wait=0.2)
    assert _alive(victim)


def test_no_directory_means_no_server(tmp_path):
    assert running_pid(str(tmp_path / "absent" / "cmd-x.sock")) is None
    assert os.path.exists(tmp_path)
