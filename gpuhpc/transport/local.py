"""Local subprocess runner (login node, or the single-machine test cluster)."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from gpuhpc.errors import TransportError
from gpuhpc.transport.base import CommandResult


class LocalRunner:
    is_local = True

    def __init__(self, env: dict[str, str] | None = None, *, base: Mapping[str, str] | None = None) -> None:
        self._env = env
        self._base = dict(base) if base is not None else None     # None: this process's environment

    def getenv(self, key: str) -> str | None:
        """``key`` as the commands this runner starts see it."""
        return (self._env or {}).get(key) or (os.environ if self._base is None else self._base).get(key)

    def environment(self) -> dict[str, str]:
        """The whole environment the commands this runner starts get (before a call's ``env``)."""
        full = dict(os.environ if self._base is None else self._base)
        full.update(self._env or {})
        return full

    def with_environment(self, env: Mapping[str, str]) -> "LocalRunner":
        """A runner whose commands get exactly ``env`` (plus a call's own ``env``), not this
        process's environment: what a sweep's arrays inherit (gpuhpc.sweeps.environment)."""
        return LocalRunner(base=env)

    def run(self, argv: list[str], *, input: str | None = None, timeout: float | None = None,
            env: dict[str, str] | None = None) -> CommandResult:
        full_env = None
        if self._base is not None or self._env or env:
            full_env = self.environment()
            full_env.update(env or {})
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, text=True,
                                  timeout=timeout, env=full_env, check=False)
        except FileNotFoundError as exc:
            raise TransportError(f"command not found: {argv[0]}", hint="is Slurm's client installed and on PATH?") from exc
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"command timed out after {timeout}s: {argv[0]}") from exc
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def write_file(self, path: str, content: str, mode: int = 0o644) -> None:
        from gpuhpc.fsutil import write_atomic     # pathlib and tempfile: not at CLI start-up

        write_atomic(path, content, mode)

    def read_file(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError as exc:
            raise TransportError(f"cannot read {path}: {exc.strerror}") from exc

    def read_from(self, path: str, offset: int) -> bytes:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read()
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise TransportError(f"cannot read {path}: {exc.strerror}") from exc

    def read_bytes(self, path: str) -> bytes:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise TransportError(f"cannot read {path}: {exc.strerror}") from exc

    def put_file(self, local: str, path: str, mode: int = 0o644) -> None:
        with open(local, "rb") as fh:
            data = fh.read()
        from gpuhpc.fsutil import write_atomic

        write_atomic(path, data, mode)

    def makedirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise TransportError(f"cannot create {path}: {exc.strerror}") from exc

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def home(self) -> str:
        return os.path.expanduser("~")
