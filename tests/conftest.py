from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    env = os.environ.get("GPUHPC_SHARED")
    if env:
        return Path(env)
    return REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    """Read-only real captures (ibnetdiscover dumps, nvidia-smi outputs)."""
    path = _shared_dir() / "fixtures"
    assert path.is_dir(), f"shared fixtures not found at {path} (set GPUHPC_SHARED)"
    return path


class CmdClient:
    """The compiled gpuhpc client (gpuhpc/cmdserver/client.c) built into a temporary
    directory, with its own private runtime directory, so that tests never touch a user's
    command server. ``run`` goes through the server; ``run_python`` is the plain CLI."""

    def __init__(self, root: Path) -> None:
        import sys

        from gpuhpc.cmdserver import build, socket_path

        self.python = sys.executable
        self.runtime = root / "run"
        self.path = build.build(str(root / "gpuhpc"))
        self.socket = socket_path({"GPUHPC_RUNTIME_DIR": str(self.runtime)})

    @property
    def env(self) -> dict[str, str]:
        """The test's environment now, pointed at this client's private server."""
        env = {**os.environ, "GPUHPC_RUNTIME_DIR": str(self.runtime)}
        env.pop("GPUHPC_CMDSERVER", None)
        return env

    def start(self) -> int:
        from gpuhpc.cmdserver.server import start

        return start(self.socket, idle=600)

    def stop(self) -> None:
        from gpuhpc.cmdserver.server import stop

        stop(self.socket)

    def pid(self) -> int | None:
        from gpuhpc.cmdserver.server import running_pid

        return running_pid(self.socket)

    def run(self, *args: str, env: dict | None = None, **kw):
        import subprocess

        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run([self.path, *args], env={**self.env, **(env or {})}, **kw)

    def run_python(self, *args: str, env: dict | None = None, **kw):
        import subprocess

        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run([self.python, "-P", "-m", "gpuhpc", *args], env={**self.env, **(env or {})}, **kw)


@pytest.fixture(scope="session")
def _cmd_client_session(tmp_path_factory):
    client = CmdClient(tmp_path_factory.mktemp("cmdserver"))
    yield client
    client.stop()


@pytest.fixture
def cmd_client(_cmd_client_session):
    """The compiled client and a running command server (started if need be; stopped at
    the end of the session)."""
    _cmd_client_session.start()
    return _cmd_client_session


@pytest.fixture
def make_cmd_client(tmp_path):
    """Build a client with a private, not yet started server; all are stopped afterwards."""
    made: list[CmdClient] = []

    def make() -> CmdClient:
        root = tmp_path / f"c{len(made)}"
        root.mkdir()
        made.append(CmdClient(root))
        return made[-1]

    yield make
    for client in made:
        client.stop()
