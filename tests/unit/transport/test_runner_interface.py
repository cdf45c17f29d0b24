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


def test_python_mode_over_a_remote_runner_checks_the_python_first():
    """Over SSH a callable goes through gpuhpc.jobs.remote: the cluster's Python is asked
    first, and a different minor version is refused before anything is copied or submitted."""
    import gpuhpc.jobs.api as api
    from gpuhpc.slurm import SlurmClient
    from gpuhpc.transport import CommandResult

    class Remote:
        is_local = False
        settings: dict = {"remote_dir": "/r"}      # where the job's checkpoints go: no SFTP call
        calls: list = []

        def run(self, argv, **kw):
            self.calls.append(argv)
            if argv[:2] == ["python3", "-c"]:
                return CommandResult(tuple(argv), 0, "3.1\n", "")
            raise AssertionError(f"nothing else may run: {argv}")

        def put_file(self, *a, **kw):
            raise AssertionError("nothing may be copied")

    runner = Remote()
    with pytest.raises(UserInputError, match="on the cluster"):
        api.submit(print, "hi", resources={"time": "10m"}, client=SlurmClient(runner))
    assert [c[0] for c in runner.calls] == ["python3"]