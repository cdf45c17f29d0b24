"""Issue 26 point 11 (SSH): ``GPUHPC_SSH_ACCEPT_NEW=1`` trusts an unknown host key for one
process only. Against the real sshd: with it a command runs and the known_hosts file is left
exactly as it was (absent, or with its own lines); the next process without it refuses the
host (UnknownHostKey); another key for the same host in the same process is a changed key."""
from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from gpuhpc.errors import TransportError
from gpuhpc.slurm import SlurmClient
from gpuhpc.transport import ssh
from gpuhpc.transport.ssh import SSHRunner, UnknownHostKey

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sshd() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/sshd.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in out.split())


def _env(sshd, known_hosts: Path, accept: bool) -> dict[str, str]:
    return {"GPUHPC_SSH_HOST": sshd["GPUHPC_TEST_SSH_HOST"], "GPUHPC_SSH_KEY": sshd["GPUHPC_TEST_SSH_KEY"],
            "GPUHPC_SSH_KNOWN_HOSTS": str(known_hosts), "GPUHPC_SSH_CONFIG": str(known_hosts) + ".noconfig",
            **({"GPUHPC_SSH_ACCEPT_NEW": "1"} if accept else {})}


def test_accept_new_keeps_the_key_in_memory_only(sshd, tmp_path, monkeypatch):
    monkeypatch.setattr(ssh, "_ACCEPTED", {})              # a fresh process
    monkeypatch.setenv("HOME", str(tmp_path))             # no system known_hosts of root's either
    known = tmp_path / "known_hosts"
    runner = SSHRunner.from_env(_env(sshd, known, accept=True))
    try:
        assert SlurmClient(runner).version[0] >= 22
    finally:
        runner.close()
    assert not known.exists()                             # nothing written for good
    known.write_text("# mine\n")
    runner = SSHRunner.from_env(_env(sshd, known, accept=True))
    try:
        assert runner.run(["true"]).ok
    finally:
        runner.close()
    assert known.read_text() == "# mine\n"
    # the next process (no accepted keys in memory) without the variable refuses the host
    monkeypatch.setattr(ssh, "_ACCEPTED", {})
    runner = SSHRunner.from_env(_env(sshd, known, accept=False))
    with pytest.raises(UnknownHostKey):
        runner.run(["true"])
    runner.close()


def test_another_key_for_an_accepted_host_is_refused(sshd, tmp_path, monkeypatch):
    host, _, port = sshd["GPUHPC_TEST_SSH_HOST"].rpartition("@")[2].partition(":")
    monkeypatch.setenv("HOME", str(tmp_path))
    entry = ssh.host_entry(host, int(port or 22))
    monkeypatch.setattr(ssh, "_ACCEPTED", {entry: paramiko.RSAKey.generate(1024)})   # accepted earlier
    runner = SSHRunner.from_env(_env(sshd, tmp_path / "known_hosts", accept=True))
    with pytest.raises(TransportError, match="HOST KEY CHANGED"):
        runner.run(["true"])
    runner.close()
    assert not (tmp_path / "known_hosts").exists()
