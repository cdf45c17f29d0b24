"""The runner interface: :class:`Runner` and the :class:`CommandResult` it returns (the
implementations, :mod:`.local` and :mod:`.ssh`, import this; :mod:`gpuhpc.transport` re-exports it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and returned."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@runtime_checkable
class Runner(Protocol):
    """Runs an argv list (never a shell string) and returns its output."""

    def run(self, argv: list[str], *, input: str | None = None, timeout: float | None = None,
            env: dict[str, str] | None = None) -> CommandResult: ...

    def write_file(self, path: str, content: str, mode: int = 0o644) -> None: ...

    def read_file(self, path: str) -> str:
        """The text of ``path`` where the commands run (undecodable bytes replaced); a missing
        or unreadable file raises TransportError."""
        ...

    @property
    def is_local(self) -> bool:
        """True when commands run on this host, as this process: the runner's files and
        environment are this process's own (a local read can replace a command)."""
        ...

    def getenv(self, key: str) -> str | None:
        """``key`` as the commands this runner starts see it, where the runner knows it (an SSH
        runner knows only the variables it passes)."""
        ...

    def read_from(self, path: str, offset: int) -> bytes:
        """The bytes of ``path`` from ``offset`` to its current end (``b""`` while the file
        does not exist): how ``gpuhpc logs -f`` follows a growing log."""
        ...

    def read_bytes(self, path: str) -> bytes:
        """The bytes of ``path`` where the commands run (a job's pickled result)."""
        ...

    def put_file(self, local: str, path: str, mode: int = 0o644) -> None:
        """Copy the local file ``local`` to ``path`` where the commands run, atomically."""
        ...

    def makedirs(self, path: str) -> None:
        """``mkdir -p path`` where the commands run (over SFTP: no remote shell)."""
        ...

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists where the commands run."""
        ...

    def home(self) -> str:
        """The home directory where the commands run (relative paths start there)."""
        ...
