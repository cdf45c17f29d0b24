"""Run Slurm commands on a remote login node over SSH (paramiko + SFTP).

The same builders and parsers as on the login node: only the Runner changes. Commands are
sent as ``shlex.join(argv)`` so every argument is quoted for the remote shell.

Configure with ``GPUHPC_SSH_HOST=[user@]host[:port]`` (plus optional ``GPUHPC_SSH_KEY`` and
``GPUHPC_SSH_KNOWN_HOSTS``, and ``GPUHPC_SSH_SLURM_CONF`` when the remote needs a
``SLURM_CONF``); unknown host keys are rejected unless ``GPUHPC_SSH_ACCEPT_NEW=1``.
"""
from __future__ import annotations

import os
import posixpath
import shlex
import socket
import threading
import uuid

import paramiko

from gpuhpc.errors import TransportError, UserInputError
from gpuhpc.transport import CommandResult


def parse_target(target: str) -> tuple[str | None, str, int]:
    """``[user@]host[:port]`` -> (user, host, port)."""
    if not target or any(c.isspace() or ord(c) < 32 for c in target):
        raise UserInputError(f"invalid SSH target {target!r}", field="GPUHPC_SSH_HOST",
                             hint="use [user@]host[:port]")
    user = None
    if "@" in target:
        user, target = target.rsplit("@", 1)
    port = 22
    if target.count(":") == 1:
        target, p = target.split(":")
        if not p.isdigit():
            raise UserInputError(f"invalid port {p!r}", field="GPUHPC_SSH_HOST", hint="use [user@]host[:port]")
        port = int(p)
    return user or None, target, port


class SSHRunner:
    is_local = False

    def __init__(self, host: str, *, user: str | None = None, port: int = 22,
                 key_filename: str | None = None, known_hosts: str | None = None,
                 accept_new_host_keys: bool = False, connect_timeout: float = 15.0,
                 env: dict[str, str] | None = None) -> None:
        self.host, self.user, self.port = host, user, port
        self.env = dict(env or {})  # exported for every remote command (e.g. SLURM_CONF)
        self.key_filename = key_filename
        self.known_hosts = known_hosts
        self.accept_new = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None    # read_from's session, on _sftp_of
        self._sftp_of: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "SSHRunner":
        env = dict(os.environ if env is None else env)
        user, host, port = parse_target(env.get("GPUHPC_SSH_HOST", ""))
        return cls(host, user=user, port=port, key_filename=env.get("GPUHPC_SSH_KEY") or None,
                   known_hosts=env.get("GPUHPC_SSH_KNOWN_HOSTS") or None,
                   accept_new_host_keys=env.get("GPUHPC_SSH_ACCEPT_NEW") == "1",
                   env={"SLURM_CONF": env["GPUHPC_SSH_SLURM_CONF"]} if env.get("GPUHPC_SSH_SLURM_CONF") else None)

    # ------------------------------------------------------------ connection
    def _connect(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None and self._client.get_transport() and self._client.get_transport().is_active():
                return self._client
            client = paramiko.SSHClient()
            client.load_system_host_keys()
            if self.known_hosts and os.path.exists(self.known_hosts):
                client.load_host_keys(self.known_hosts)
            client.set_missing_host_key_policy(
                paramiko.AutoAddPolicy() if self.accept_new else paramiko.RejectPolicy())
            try:
                client.connect(self.host, port=self.port, username=self.user,
                               key_filename=self.key_filename, timeout=self.connect_timeout,
                               banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                               look_for_keys=self.key_filename is None, allow_agent=True)
            except paramiko.SSHException as exc:
                raise TransportError(f"ssh {self._where()}: {exc}",
                                     hint="check GPUHPC_SSH_HOST / GPUHPC_SSH_KEY and the host key") from exc
            except (OSError, socket.timeout) as exc:
                raise TransportError(f"ssh {self._where()}: cannot connect: {exc}") from exc
            self._client = client
            return client

    def _where(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # ------------------------------------------------------------ Runner protocol
    def getenv(self, key: str) -> str | None:
        """Only what this runner passes to remote commands; the remote login environment is unknown."""
        return self.env.get(key)

    def run(self, argv: list[str], *, input: str | None = None, timeout: float | None = None,
            env: dict[str, str] | None = None) -> CommandResult:
        command = shlex.join(argv)
        full_env = {**self.env, **(env or {})}
        if full_env:
            command = shlex.join(["env", *(f"{k}={v}" for k, v in full_env.items())]) + " " + command
        client = self._connect()
        try:
            stdin, stdout, stderr = client.exec_command(command, timeout=timeout)
            if input is not None:
                stdin.write(input)
            stdin.channel.shutdown_write()
            out = stdout.read().decode("utf-8", "replace")
            err = stderr.read().decode("utf-8", "replace")
            rc = stdout.channel.recv_exit_status()
        except (paramiko.SSHException, socket.timeout, OSError) as exc:
            self.close()
            raise TransportError(f"ssh {self._where()}: running {argv[0]} failed: {exc}") from exc
        return CommandResult(tuple(argv), rc, out, err)

    def write_file(self, path: str, content: str, mode: int = 0o644) -> None:
        sftp = self._connect().open_sftp()
        try:
            tmp = posixpath.join(posixpath.dirname(path) or ".", f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}")
            self._mkdirs(sftp, posixpath.dirname(path))
            with sftp.open(tmp, "w") as fh:
                fh.write(content.encode())
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except OSError as exc:
            raise TransportError(f"sftp {self._where()}: cannot write {path}: {exc}") from exc
        finally:
            sftp.close()

    def read_file(self, path: str) -> str:
        sftp = self._connect().open_sftp()
        try:
            with sftp.open(path, "r") as fh:
                return fh.read().decode("utf-8", "replace")
        except OSError as exc:
            raise TransportError(f"sftp {self._where()}: cannot read {path}: {exc}") from exc
        finally:
            sftp.close()

    def read_from(self, path: str, offset: int) -> bytes:
        """Reads only the new bytes; the SFTP session stays open between calls (a follower
        calls this every half second)."""
        try:
            sftp = self._sftp_session()
            with sftp.open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read()
        except FileNotFoundError:
            return b""
        except (OSError, paramiko.SSHException) as exc:
            self._sftp = None
            raise TransportError(f"sftp {self._where()}: cannot read {path}: {exc}") from exc

    def _sftp_session(self) -> paramiko.SFTPClient:
        client = self._connect()
        if self._sftp is None or self._sftp_of is not client:
            self._sftp, self._sftp_of = client.open_sftp(), client
        return self._sftp

    @staticmethod
    def _mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
        if not path or path == "/":
            return
        try:
            sftp.stat(path)
        except OSError:
            SSHRunner._mkdirs(sftp, posixpath.dirname(path))
            sftp.mkdir(path)
