from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Jobs on the local cluster get a private /tmp (job_container/tmpfs): a file a job writes under
# /tmp is invisible here. pytest's tmp_path (and tempfile) therefore live under /var/tmp, on the
# real disk that jobs and tests share. An explicit TMPDIR outside /tmp is kept.
if not os.environ.get("TMPDIR", "").startswith("/var/tmp"):
    _TMP = Path("/var/tmp/gpuhpc-pytest")
    _TMP.mkdir(mode=0o1777, parents=True, exist_ok=True)
    _TMP.chmod(0o1777)
    os.environ["TMPDIR"] = str(_TMP)
    tempfile.tempdir = None   # tempfile caches gettempdir(): read TMPDIR again


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


FIXTURES = REPO / "tests" / "fixtures"
INTEGRATION = REPO / "tests" / "integration"


def pytest_collection_modifyitems(config, items):
    """The directory decides: everything under tests/integration needs the running cluster or
    services and is marked ``integration``, so ``-m "not integration"`` is the tier that needs
    nothing running (scripts/test.sh --fast)."""
    for item in items:
        if Path(str(item.path)).is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Read-only real captures in the repository, tests/fixtures/ (ibnetdiscover dumps, nvidia-smi
    outputs; where each came from: tests/fixtures/*/SOURCES.md, README.md)."""
    return FIXTURES


class CmdClient:
    """The compiled gpuhpc client (gpuhpc/cmdserver/client.c) built into a temporary
    directory, with its own private runtime directory and its own config files (the user's
    enables the command server, the site's is absent), so that tests never touch a user's
    command server or config. ``run`` goes through the server; ``run_python`` is the plain CLI;
    ``log`` is the server's event log (``declines()``: one line per declined request)."""

    def __init__(self, root: Path) -> None:
        import sys

        from gpuhpc.cmdserver import build, socket_path

        self.python = sys.executable
        # a short path: a UNIX socket's path is limited to 107 bytes, more than tmp_path leaves
        self.runtime = Path(tempfile.mkdtemp(prefix="gpuhpc-cs-", dir="/var/tmp")) / "run"
        self.user_config = root / "config.toml"
        self.user_config.write_text("[cmdserver]\nenabled = true\n")
        self.site_config = root / "site-config.toml"
        self.path = build.build(str(root / "gpuhpc"))
        self.socket = socket_path({"GPUHPC_RUNTIME_DIR": str(self.runtime)})
        self.log = Path(self.socket[: -len(".sock")] + ".log")

    @property
    def env(self) -> dict[str, str]:
        """The test's environment now, pointed at this client's private server and config."""
        env = {**os.environ, "GPUHPC_RUNTIME_DIR": str(self.runtime), "GPUHPC_CONFIG": str(self.user_config),
               "GPUHPC_SITE_CONFIG": str(self.site_config)}
        env.pop("GPUHPC_CMDSERVER", None)
        return env

    def declines(self) -> list[str]:
        """The server log's lines for requests it declined, oldest first."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if "] declined " in line]

    def start(self) -> int:
        from gpuhpc.cmdserver.server import start

        return start(self.socket, idle=600, env=self.env)

    def stop(self) -> None:
        from gpuhpc.cmdserver.server import stop

        stop(self.socket)

    def pid(self) -> int | None:
        from gpuhpc.cmdserver.server import running_pid

        return running_pid(self.socket)

    def run(self, *args: str, env: dict | None = None, wrap: tuple[str, ...] = (), **kw):
        """The client with ``args``; ``wrap`` is a command that execs it (``setpriv ... --``)."""
        import subprocess

        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run([*wrap, self.path, *args], env={**self.env, **(env or {})}, **kw)

    def who_runs(self, *wrapper: str, env: dict | None = None, timeout: float = 60) -> str:
        """Which path runs a command started as ``wrapper... CLIENT topology from-ibnetdiscover -``
        (every wrapper must exec, e.g. ``setpriv ... --``, ``bash -c 'ulimit -n 777; exec "$@"' -``):
        "server" once a worker of this client's server holds the command's stdin, "python" once
        the client has exec'd the Python CLI. The command blocks reading stdin until we close it."""
        import subprocess

        proc = subprocess.Popen([*wrapper, self.path, "topology", "from-ibnetdiscover", "-"],
                                env={**self.env, **(env or {})}, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            return self.taken(proc, timeout)
        finally:
            proc.stdin.close()
            proc.wait(timeout=60)

    def taken(self, proc, timeout: float = 60) -> str:
        """Poll until the command ``proc`` (the client, started with ``stdin=PIPE``) is taken:
        "server" once a worker of this client's server holds its stdin, "python" once the client
        has exec'd the Python CLI."""
        import sys

        from polling import wait_for

        server = self.pid()
        python = os.path.realpath(sys.executable)
        pipe = f"pipe:[{os.fstat(proc.stdin.fileno()).st_ino}]"

        def readlink(path: str) -> str:
            try:
                return os.readlink(path)
            except OSError:
                return ""

        def workers() -> list[str]:
            out = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/stat") as fh:
                        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == server:
                    out.append(pid)
            return out

        def who() -> str | None:
            if os.path.realpath(readlink(f"/proc/{proc.pid}/exe")) == python:
                return "python"
            if server and any(readlink(f"/proc/{w}/fd/0") == pipe for w in workers()):
                return "server"
            return None

        return wait_for(who, timeout, "a server worker or the Python CLI to take the command", interval=0.05,
                        abort=lambda: proc.poll() is not None
                        and f"the command exited ({proc.returncode}) before reading stdin")

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
