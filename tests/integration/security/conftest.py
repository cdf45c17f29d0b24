"""The hostile-user suite (issue 26): each test performs an attack as a throwaway ordinary Unix
user and asserts that it fails and that nothing changed.

``hostile`` creates that user (``useradd``) with a Slurm association in account ``research``
(``sacctmgr``), and removes both afterwards, with every job it submitted (by id: never
``scancel -u``). ``hostile.run(argv)`` runs a command as that user (``runuser``), with the
system's PATH, in a directory of its own under /var/tmp.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest


ACCOUNT = "research"


class Hostile:
    """A throwaway ordinary user; ``jobs`` collects the ids it submitted (cancelled at the end)."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        pw = pwd.getpwnam(name)
        self.uid, self.gid, self.home = pw.pw_uid, pw.pw_gid, pw.pw_dir
        self.workdir = workdir
        self.jobs: list[str] = []

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # the system's tools only: the attacks need sbatch, scontrol, psql, coreutils (this
        # checkout's interpreter may live where an ordinary user cannot read)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin",
               "HOME": self.home, "USER": self.name, "LOGNAME": self.name, "LANG": "C.UTF-8",
               "TMPDIR": str(self.workdir)}
        for key in ("SLURM_CONF",):
            if os.environ.get(key):
                env[key] = os.environ[key]
        env.update(extra or {})
        return env

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            input: str | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """``argv`` as this user (never through a shell: argv elements may hold any byte)."""
        return subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in
                                                                                  self.env(env).items()), *argv],
                              capture_output=True, text=True, timeout=timeout, input=input,
                              cwd=str(cwd or self.workdir))

    def sbatch(self, *args: str) -> str:
        """``sbatch --parsable ARGS`` as this user; the job id (cancelled at teardown)."""
        res = self.run(["sbatch", "--parsable", *args])
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip().split(";", 1)[0]
        self.jobs.append(job)
        return job


def _root(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise AssertionError(f"{argv}: {res.stderr or res.stdout}")
    return res


@pytest.fixture(scope="session")
def hostile():
    if os.geteuid() != 0:
        pytest.fail("the hostile-user suite creates a throwaway user: run it as root", pytrace=False)
    name = f"gh{uuid.uuid4().hex[:8]}"
    cluster = next((line.split("=", 1)[1].strip() for line in _root(["scontrol", "show", "config"]).stdout.splitlines()
                    if line.split("=", 1)[0].strip() == "ClusterName"), "")
    on_cluster = [f"cluster={cluster}"] if cluster else []
    _root(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name])
    workdir = Path(tempfile.mkdtemp(prefix=f"gpuhpc-{name}-", dir="/var/tmp"))
    h = None
    try:
        shutil.chown(workdir, name, name)
        os.chmod(workdir, 0o700)
        _root(["sacctmgr", "-i", "add", "user", name, f"account={ACCOUNT}", *on_cluster])
        h = Hostile(name, workdir)
        yield h
    finally:
        for job in (h.jobs if h else []):
            _root(["scancel", job], check=False)
        _root(["sacctmgr", "-i", "delete", "user", f"name={name}", *on_cluster], check=False)
        _root(["userdel", "--remove", name], check=False)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def site_python() -> str:
    """The gpuhpc install every user can run (``.venv/site``, made by scripts/services/sshd.sh
    start: this checkout's .venv interpreter is not readable by other users)."""
    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k not in ("D", "PORT")}     # the shared sshd's own
    subprocess.run(["bash", str(repo / "scripts/services/sshd.sh"), "start"], check=True, capture_output=True,
                   timeout=600, env=env)
    python = repo / ".venv" / "site" / "bin" / "python"
    assert python.exists(), f"{python} missing (scripts/services/sshd.sh start makes it)"
    return str(python)
