"""Run Slurm commands on a remote login node over SSH (paramiko + SFTP).

The same builders and parsers as on the login node: only the Runner changes. Commands are
sent as ``shlex.join(argv)`` so every argument is quoted for the remote shell.

Where to connect comes from a cluster profile (``gpuhpc --cluster NAME``, ``GPUHPC_CLUSTER``:
``[clusters.NAME]`` in the user config, :mod:`gpuhpc.config`) or from the shorthand
``GPUHPC_SSH_HOST=[user@]host[:port]`` (plus optional ``GPUHPC_SSH_KEY``,
``GPUHPC_SSH_KNOWN_HOSTS``, ``GPUHPC_SSH_JUMP`` and ``GPUHPC_SSH_SLURM_CONF``). Either way
``~/.ssh/config`` (``GPUHPC_SSH_CONFIG`` for another file) fills in what is not given:
HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile.

Host keys: an unknown key is refused with its fingerprint and the command that trusts it
(``gpuhpc cluster trust NAME``, :func:`trust`); a changed key is refused loudly.
``GPUHPC_SSH_ACCEPT_NEW=1`` accepts unknown keys for this process only (tests, throwaway
hosts): they are kept in memory, never written to known_hosts. One connection (and one SFTP session) per target serves a whole command
(:func:`shared_runner`); it is closed at exit.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import posixpath
import shlex
import socket
import stat
import threading
import uuid
from typing import Any

import paramiko

from gpuhpc.config import getenv
from gpuhpc.errors import TransportError, UserInputError
from gpuhpc.transport.base import CommandResult


def parse_target(target: str, field: str = "GPUHPC_SSH_HOST") -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` -> (user, host, port); port None when not given."""
    if not target or any(c.isspace() or ord(c) < 32 for c in target):
        raise UserInputError(f"invalid SSH target {target!r}", field=field, hint="use [user@]host[:port]")
    user = None
    if "@" in target:
        user, target = target.rsplit("@", 1)
    port = None
    if target.count(":") == 1:
        target, p = target.split(":")
        if not p.isdigit() or not 0 < int(p) < 65536:
            raise UserInputError(f"invalid port {p!r}", field=field, hint="use [user@]host[:port]")
        port = int(p)
    if not target or target.startswith("-"):
        raise UserInputError(f"invalid SSH host {target!r}", field=field, hint="use [user@]host[:port]")
    return user or None, target, port


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's form: ``SHA256:<base64, no padding>``."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def host_entry(host: str, port: int) -> str:
    """The known_hosts name of ``host:port`` (``[host]:port`` unless the port is 22)."""
    return host if port == 22 else f"[{host}]:{port}"


class UnknownHostKey(TransportError):
    """The server's host key is in no known_hosts file."""

    def __init__(self, message: str, *, hint: str | None = None, key: paramiko.PKey | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


class _Unknown(Exception):
    def __init__(self, key: paramiko.PKey) -> None:
        self.key = key


class _RaiseUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):     # noqa: D401 - paramiko's hook
        raise _Unknown(key)


# host keys accepted by GPUHPC_SSH_ACCEPT_NEW=1 in this process: kept in memory only, never
# written to a known_hosts file (paramiko's AutoAddPolicy saves them for good)
_ACCEPTED: dict[str, paramiko.PKey] = {}
_accepted_lock = threading.Lock()


class _AcceptForThisProcess(paramiko.MissingHostKeyPolicy):
    """Accept an unknown host key for the rest of this process; another key for the same host
    later in the process is a changed key."""

    def missing_host_key(self, client, hostname, key):     # noqa: D401 - paramiko's hook
        with _accepted_lock:
            seen = _ACCEPTED.setdefault(hostname, key)
        if (seen.get_name(), seen.asbytes()) != (key.get_name(), key.asbytes()):
            raise paramiko.BadHostKeyException(hostname, key, seen)
        client.get_host_keys().add(hostname, key.get_name(), key)     # this client's memory; no save


def _ssh_config(path: str | None = None) -> paramiko.SSHConfig | None:
    path = path or getenv("GPUHPC_SSH_CONFIG") or os.path.expanduser("~/.ssh/config")
    if not os.path.exists(path):
        return None
    try:
        return paramiko.SSHConfig.from_path(path)
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise UserInputError(f"cannot read {path}: {exc}", field="ssh config") from exc


class SSHRunner:
    is_local = False

    def __init__(self, host: str, *, user: str | None = None, port: int | None = None,
                 key_filename: str | None = None, known_hosts: str | None = None,
                 accept_new_host_keys: bool = False, connect_timeout: float = 15.0,
                 env: dict[str, str] | None = None, jump: str | None = None,
                 name: str | None = None, ssh_config: str | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        self.alias = host
        self.name = name                    # the profile (for messages: gpuhpc cluster trust NAME)
        self.env = dict(env or {})          # exported for every remote command (e.g. SLURM_CONF)
        self.settings = dict(settings or {})    # the profile's other keys (remote_dir, python, ...)
        cfg = _ssh_config(ssh_config)
        found: dict[str, Any] = cfg.lookup(host) if cfg is not None else {}
        self.host = found.get("hostname") or host
        self.user = user or found.get("user") or None
        self.port = int(port or found.get("port") or 22)
        keys = found.get("identityfile") or []
        self.key_filename = os.path.expanduser(key_filename) if key_filename else \
            next((os.path.expanduser(k) for k in keys if os.path.exists(os.path.expanduser(k))), None)
        self.known_hosts = os.path.expanduser(known_hosts) if known_hosts else None
        if not self.known_hosts and found.get("userknownhostsfile"):
            self.known_hosts = os.path.expanduser(found["userknownhostsfile"].split()[0])
        proxy = jump if jump is not None else found.get("proxyjump")
        self.jump = None if not proxy or proxy.lower() == "none" else proxy
        self.ssh_config = ssh_config
        self.accept_new = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self._client: paramiko.SSHClient | None = None
        self._jump_runner: SSHRunner | None = None
        self._sftp: paramiko.SFTPClient | None = None    # one SFTP session, on _sftp_of
        self._sftp_of: paramiko.SSHClient | None = None
        self._lock = threading.RLock()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "SSHRunner":
        env = dict(os.environ if env is None else env)
        user, host, port = parse_target(getenv("GPUHPC_SSH_HOST", env) or "")
        slurm_conf = getenv("GPUHPC_SSH_SLURM_CONF", env)
        return cls(host, user=user, port=port, key_filename=getenv("GPUHPC_SSH_KEY", env),
                   known_hosts=getenv("GPUHPC_SSH_KNOWN_HOSTS", env),
                   accept_new_host_keys=getenv("GPUHPC_SSH_ACCEPT_NEW", env) == "1",
                   jump=getenv("GPUHPC_SSH_JUMP", env), name=getenv("GPUHPC_SSH_HOST", env),
                   env={"SLURM_CONF": slurm_conf} if slurm_conf else None)

    @classmethod
    def from_profile(cls, profile: dict[str, Any], env: dict[str, str] | None = None) -> "SSHRunner":
        """A runner for a cluster profile (:func:`gpuhpc.config.cluster_profile`)."""
        env = dict(os.environ if env is None else env)
        user, host, port = parse_target(profile["host"], f"clusters.{profile['name']}.host")
        return cls(host, user=profile.get("user") or user, port=profile.get("port") or port,
                   key_filename=profile.get("key"), known_hosts=profile.get("known_hosts"),
                   accept_new_host_keys=getenv("GPUHPC_SSH_ACCEPT_NEW", env) == "1",
                   jump=profile.get("jump"), name=profile["name"],
                   env={"SLURM_CONF": profile["slurm_conf"]} if profile.get("slurm_conf") else None,
                   settings={k: v for k, v in profile.items() if k not in ("name", "host")})

    # ------------------------------------------------------------ connection
    def _where(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"

    def _trust_command(self) -> str:
        return f"gpuhpc cluster trust {shlex.quote(self.name or self._where())}"

    def _sock(self):
        """A channel through the jump host(s) to this host, or None for a direct connection."""
        if not self.jump:
            return None
        hops = [h.strip() for h in self.jump.split(",") if h.strip()]
        user, host, port = parse_target(hops[-1], "jump")
        if self._jump_runner is None:
            self._jump_runner = SSHRunner(host, user=user, port=port, known_hosts=self.known_hosts,
                                          key_filename=None, accept_new_host_keys=self.accept_new,
                                          connect_timeout=self.connect_timeout, name=self.name,
                                          jump=",".join(hops[:-1]), ssh_config=self.ssh_config)
            if self._jump_runner.key_filename is None:
                self._jump_runner.key_filename = self.key_filename
        transport = self._jump_runner._connect().get_transport()
        try:
            return transport.open_channel("direct-tcpip", (self.host, self.port), ("127.0.0.1", 0),
                                          timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError) as exc:
            raise TransportError(f"ssh {self._where()} through jump host {hops[-1]}: {exc}") from exc

    def _connect(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None and self._client.get_transport() and self._client.get_transport().is_active():
                return self._client
            client = paramiko.SSHClient()
            self._load_host_keys(client)
            client.set_missing_host_key_policy(_AcceptForThisProcess() if self.accept_new else _RaiseUnknown())
            try:
                client.connect(self.host, port=self.port, username=self.user, sock=self._sock(),
                               key_filename=self.key_filename, timeout=self.connect_timeout,
                               banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                               look_for_keys=self.key_filename is None, allow_agent=True)
            except _Unknown as exc:
                client.close()
                raise UnknownHostKey(
                    f"ssh {self._where()}: unknown host key {exc.key.get_name()} {fingerprint(exc.key)}",
                    hint=f"check the fingerprint with the cluster's admins, then run: {self._trust_command()}",
                    key=exc.key) from None
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise TransportError(
                    f"ssh {self._where()}: HOST KEY CHANGED: known_hosts has {fingerprint(exc.expected_key)}, "
                    f"the server now shows {exc.key.get_name()} {fingerprint(exc.key)}; someone may be "
                    "intercepting the connection (or the host was reinstalled)",
                    hint="refusing to connect; ask the cluster's admins, and only then remove the old line "
                         f"(ssh-keygen -R '{host_entry(self.host, self.port)}') and run {self._trust_command()}") from None
            except paramiko.AuthenticationException as exc:
                client.close()
                raise TransportError(f"ssh {self._where()}: authentication failed: {exc}",
                                     hint="check the profile's user and key (or GPUHPC_SSH_KEY), "
                                          "and that the key is in the remote authorized_keys") from exc
            except paramiko.SSHException as exc:
                client.close()
                raise TransportError(f"ssh {self._where()}: {exc}") from exc
            except (OSError, socket.timeout) as exc:
                client.close()
                raise TransportError(f"ssh {self._where()}: cannot connect: {exc.strerror or exc}",
                                     hint="is the host name right and the host reachable from here?") from exc
            self._client = client
            return client

    def _load_host_keys(self, client: paramiko.SSHClient) -> None:
        try:
            client.load_system_host_keys()
            if self.known_hosts and os.path.exists(self.known_hosts):
                client.load_host_keys(self.known_hosts)
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise TransportError(f"cannot read known_hosts: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except Exception:  # noqa: BLE001 - closing a dead session
                    pass
                self._sftp = self._sftp_of = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._jump_runner is not None:
                self._jump_runner.close()

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

    def write_file(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        data = content.encode() if isinstance(content, str) else content
        self._atomic_put(path, mode, lambda sftp, tmp: sftp.putfo(io.BytesIO(data), tmp, confirm=False))

    def put_file(self, local: str, path: str, mode: int = 0o644) -> None:
        """Copy the local file ``local`` to ``path`` on the remote (atomically: temp name, rename)."""
        self._atomic_put(path, mode, lambda sftp, tmp: sftp.put(local, tmp, confirm=False))

    def _atomic_put(self, path: str, mode: int, send) -> None:
        try:
            sftp = self._sftp_session()
            tmp = posixpath.join(posixpath.dirname(path) or ".", f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}")
            self._mkdirs(sftp, posixpath.dirname(path))
            send(sftp, tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except (OSError, paramiko.SSHException) as exc:
            self._sftp = None
            raise TransportError(f"sftp {self._where()}: cannot write {path}: {exc}") from exc

    def read_file(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8", "replace")

    def read_bytes(self, path: str) -> bytes:
        try:
            with self._sftp_session().open(path, "rb") as fh:
                fh.prefetch()
                return fh.read()
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"sftp {self._where()}: cannot read {path}: {exc}") from exc

    def makedirs(self, path: str) -> None:
        try:
            self._mkdirs(self._sftp_session(), path)
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"sftp {self._where()}: cannot create {path}: {exc}") from exc

    def exists(self, path: str) -> bool:
        try:
            self._sftp_session().stat(path)
            return True
        except FileNotFoundError:
            return False
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"sftp {self._where()}: cannot stat {path}: {exc}") from exc

    def home(self) -> str:
        """The remote home directory (where SFTP's relative paths start)."""
        try:
            return self._sftp_session().normalize(".")
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"sftp {self._where()}: cannot find the home directory: {exc}") from exc

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
        with self._lock:
            client = self._connect()
            if self._sftp is None or self._sftp_of is not client:
                self._sftp, self._sftp_of = client.open_sftp(), client
            return self._sftp

    @staticmethod
    def _mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
        if not path or path in ("/", "."):
            return
        try:
            if stat.S_ISDIR(sftp.stat(path).st_mode):
                return
        except OSError:
            pass
        SSHRunner._mkdirs(sftp, posixpath.dirname(path))
        try:
            sftp.mkdir(path)
        except OSError:
            if not stat.S_ISDIR(sftp.stat(path).st_mode):    # made meanwhile by another upload
                raise

    def run_interactive(self, argv: list[str], *, env: dict[str, str] | None = None, on_output=None) -> int:
        """``argv`` on a pseudo-terminal on the remote host (paramiko ``get_pty``), wired to this
        process's stdin and stdout (a local terminal is raw meanwhile: every key, Ctrl-C too, goes
        to the remote pty); ``on_output(bytes)`` sees what it prints. Its exit status (``gpuhpc shell``)."""
        import select
        import shutil
        import sys

        command = shlex.join(argv)
        full_env = {**self.env, **(env or {})}
        if full_env:
            command = shlex.join(["env", *(f"{k}={v}" for k, v in full_env.items())]) + " " + command
        fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
        size = shutil.get_terminal_size()
        sys.stdout.flush()
        try:
            chan = self._connect().get_transport().open_session()
            chan.get_pty(term=os.environ.get("TERM") or "vt100", width=size.columns, height=size.lines)
            chan.exec_command(command)
        except (paramiko.SSHException, OSError) as exc:
            self.close()
            raise TransportError(f"ssh {self._where()}: no terminal for {argv[0]}: {exc}") from exc
        saved = None
        if os.isatty(fd_in):
            import termios
            import tty

            saved = termios.tcgetattr(fd_in)
            tty.setraw(fd_in)
        readers: list[Any] = [chan, fd_in]
        try:
            while True:
                ready = select.select(readers, [], [])[0]
                if chan in ready:
                    data = chan.recv(32768)
                    if not data:
                        break
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd_out, view):]
                    if on_output is not None:
                        on_output(data)
                if fd_in in ready:
                    data = os.read(fd_in, 4096)
                    if data:
                        chan.sendall(data)
                    else:                   # stdin ended: the remote side reads EOF
                        readers.remove(fd_in)
                        chan.shutdown_write()
            return chan.recv_exit_status()
        finally:
            if saved is not None:
                termios.tcsetattr(fd_in, termios.TCSADRAIN, saved)
            chan.close()


# ---------------------------------------------------------------- one connection per command
_RUNNERS: dict[tuple, SSHRunner] = {}


def shared_runner(env: dict[str, str] | None = None) -> SSHRunner:
    """The runner ``GPUHPC_CLUSTER`` (a profile) or ``GPUHPC_SSH_HOST`` names, made once per
    process: every SlurmClient of one command shares its connection, closed at exit."""
    env = dict(os.environ if env is None else env)
    name = getenv("GPUHPC_CLUSTER", env)
    if name:
        from gpuhpc.config import cluster_profile

        profile = cluster_profile(name, env)
        key: tuple = ("profile", tuple(sorted(profile.items())), getenv("GPUHPC_SSH_ACCEPT_NEW", env))
        make = lambda: SSHRunner.from_profile(profile, env)  # noqa: E731
    else:
        key = ("env", *(getenv(k, env) for k in ("GPUHPC_SSH_HOST", "GPUHPC_SSH_KEY", "GPUHPC_SSH_KNOWN_HOSTS",
                                             "GPUHPC_SSH_JUMP", "GPUHPC_SSH_SLURM_CONF", "GPUHPC_SSH_ACCEPT_NEW")))
        make = lambda: SSHRunner.from_env(env)  # noqa: E731
    runner = _RUNNERS.get(key)
    if runner is None:
        if not _RUNNERS:
            import atexit

            atexit.register(close_all)
        runner = _RUNNERS[key] = make()
    return runner


def close_all() -> None:
    """Close every shared connection (at exit)."""
    for runner in list(_RUNNERS.values()):
        runner.close()
    _RUNNERS.clear()


# ---------------------------------------------------------------- gpuhpc cluster trust
def scan_host_key(runner: SSHRunner) -> paramiko.PKey:
    """The host key the server (through the runner's jump hosts) presents; nothing is trusted."""
    sock = runner._sock() or socket.create_connection((runner.host, runner.port), timeout=runner.connect_timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=runner.connect_timeout)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, OSError) as exc:
        raise TransportError(f"ssh {runner._where()}: cannot read the host key: {exc}") from exc
    finally:
        transport.close()


def runner_for(name: str, env: dict[str, str] | None = None) -> SSHRunner:
    """A new runner for a profile name, or for ``[user@]host[:port]`` (not a profile)."""
    from gpuhpc.config import cluster_profile, cluster_profiles

    env = dict(os.environ if env is None else env)
    if name in cluster_profiles(env) or not any(c in name for c in "@:."):
        return SSHRunner.from_profile(cluster_profile(name, env), env)
    user, host, port = parse_target(name, "NAME")
    return SSHRunner(host, user=user, port=port, known_hosts=getenv("GPUHPC_SSH_KNOWN_HOSTS", env),
                     key_filename=getenv("GPUHPC_SSH_KEY", env), jump=getenv("GPUHPC_SSH_JUMP", env),
                     name=name)


def known_hosts_path(runner: SSHRunner) -> str:
    return runner.known_hosts or os.path.expanduser("~/.ssh/known_hosts")


def trust(runner: SSHRunner, key: paramiko.PKey) -> tuple[str, bool]:
    """Add ``key`` for the runner's host to its known_hosts file (created 0600). Returns (path,
    added): False when that key is known already. A different known key is a TransportError
    (remove it first, on purpose)."""
    path = known_hosts_path(runner)
    entry = host_entry(runner.host, runner.port)
    keys = paramiko.HostKeys()
    if os.path.exists(path):
        try:
            keys.load(path)
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise TransportError(f"cannot read {path}: {exc}") from exc
    known = keys.lookup(entry) or {}
    if key.get_name() in known:
        if known[key.get_name()] == key:
            return path, False
        raise TransportError(f"{path} already has a different {key.get_name()} key for {entry} "
                             f"({fingerprint(known[key.get_name()])}): the host key CHANGED",
                             hint=f"ask the cluster's admins; only then run ssh-keygen -f {path} -R '{entry}' and trust again")
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(f"{entry} {key.get_name()} {key.get_base64()}\n")
    return path, True
