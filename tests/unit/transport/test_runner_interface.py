"""The Runner protocol answers what callers used to learn from ``isinstance(.., LocalRunner)``."""
from __future__ import annotations

import pytest

from gpuhpc.errors import TransportError, UserInputError
from gpuhpc.transport import Runner
from gpuhpc.transport.local import LocalRunner
from gpuhpc.transport.ssh import SSHRunner


def test_both_runners_implement_the_protocol():
    local, remote = LocalRunner(env={"SLURM_CONF": "/x"}), SSHRunner("login1", env={"SLURM_CONF": "/y"})
    assert isinstance(local, Runner) and isinstance(remote, Runner)
    assert local.is_local is True and remote.is_local is False
    assert local.getenv("SLURM_CONF") == "/x" and remote.getenv("SLURM_CONF") == "/y"
    assert remote.getenv("HOME") is None          # the remote login environment is not known here


def test_local_read_file_is_like_the_ssh_one(tmp_path):
    p = tmp_path / "log"
    p.write_bytes(b"ok \xff\n")
    assert LocalRunner().read_file(str(p)) == "ok \ufffd\n"       # undecodable bytes replaced, as over SFTP
    with pytest.raises(TransportError):
        LocalRunner().read_file(str(tmp_path / "missing"))


def test_python_mode_refuses_a_remote_runner():
    """submitit runs sbatch itself, locally: over SSH a callable is refused before anything is
    reserved or run (the documented exception in docs/DEVELOPING.md)."""
    import gpuhpc.jobs.api as api
    from gpuhpc.slurm import SlurmClient

    class Remote:
        is_local = False
        calls: list = []

        def run(self, argv, **kw):
            self.calls.append(argv)
            raise AssertionError("nothing may run")

    runner = Remote()
    with pytest.raises(UserInputError, match="Python callable"):
        api.submit(print, "hi", resources={"time": "10m"}, client=SlurmClient(runner))
    assert runner.calls == []
