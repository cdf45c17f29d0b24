"""The pre-forking command server behind the C client (design: :mod:`gpuhpc.cmdserver`):
the master.

The master imports the CLI once (:data:`PRELOAD`), walks the common path once
(:func:`~gpuhpc.cmdserver.worker.rehearse`), binds the socket and keeps a forked worker
(:mod:`gpuhpc.cmdserver.worker`) blocked in ``accept()``, so that no fork happens on a
command's critical path. A worker that accepts a connection tells the master and serves the
command. After a ``submit`` that left the process as it found it
(:class:`~gpuhpc.cmdserver.state.WorkerState`) the worker goes back to ``accept()``; after
anything else it exits. The master forks another worker only once every worker has been busy
for :data:`_REFILL_DELAY` (concurrent or long commands: ``logs -f`` never blocks others) or
one has exited, and when more than :data:`_SPARES` are idle it retires all but the most
recently used (the one with the warmest caches).

The master does not start unless the command server is enabled (:func:`gpuhpc.config.cmdserver`).
It stops when idle, on SIGTERM, when gpuhpc's code or config changes
(:class:`~gpuhpc.cmdserver.codewatch.CodeWatch`) or when its socket is removed; idle workers
notice within a second and exit, busy ones finish.

Wire format: :mod:`gpuhpc.cmdserver.protocol`.
"""
from __future__ import annotations

import errno
import fcntl
import importlib
import os
import select
import signal
import socket
import sys
import time

from gpuhpc.cmdserver import ensure_private_dir, lock_path
from gpuhpc.cmdserver.codewatch import CodeWatch
from gpuhpc.cmdserver.protocol import MESSAGE, Identity, Msg, unpack
from gpuhpc.cmdserver.worker import RETIRE, EventLog, Worker, rehearse

_MAX_WORKERS = 256
_SPARES = 1                          # idle workers waiting in accept()
_REFILL_DELAY = 0.05                 # fork another once every worker has been busy this long (s)

# imported once by the master so that workers start warm; heavy optional stacks (boto3,
# paramiko) are left to the commands that need them
PRELOAD = ("gpuhpc.cli", "gpuhpc.cli.main", "gpuhpc.cli.submit", "gpuhpc.cli.jobs", "click", "gpuhpc.jobs.spec", "gpuhpc.jobs.render",
           "gpuhpc.jobs.api", "gpuhpc.jobs.checkpoint", "gpuhpc.ledger.hooks",
           "gpuhpc.slurm.client", "gpuhpc.slurm.parsers", "gpuhpc.slurm.commands", "gpuhpc.slurm.state",
           "gpuhpc.transport.local", "gpuhpc.cluster", "gpuhpc.ledger.db", "gpuhpc.ledger.orm",
           "gpuhpc.ledger.quota", "gpuhpc.ledger.reports", "gpuhpc.ledger.ingest", "gpuhpc.spec.cluster",
           "gpuhpc.conf.render", "rich.console", "rich.table", "json", "yaml", "sqlite3", "submitit", "jinja2")


def preload(modules=PRELOAD) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


class _Master:
    """The master's loop: keeps a spare worker in accept(), follows the workers' notes,
    reaps them, and decides when to stop (:meth:`run`)."""

    def __init__(self, sock_path: str, inode: int, listener: socket.socket, code: CodeWatch,
                 idle: float, log: EventLog, close_in_worker: list[int]) -> None:
        self.sock_path, self.inode, self.listener, self.code = sock_path, inode, listener, code
        self.idle, self.log = idle, log
        self.master_env = dict(os.environ)
        self.identity = Identity.of_this_process()
        self.pid = os.getpid()
        self.note_r, self.note_w = os.pipe()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.close_in_worker = [self.note_r, self.wake_r, self.wake_w, *close_in_worker]
        self.stopping: list[str] = []
        self.spares: dict[int, float] = {}     # idle workers (in accept) -> idle since
        self.busy: dict[int, float] = {}       # serving a command -> since
        self.retiring: set[int] = set()
        self.early_deaths = 0
        self.refill = True
        self.last = time.monotonic()
        self.pending = b""

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.append("SIGTERM"))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        while not self.stopping:
            now = time.monotonic()
            self._keep_a_spare(now)
            watched = [self.note_r, self.wake_r] + ([self.code.fd] if self.code.fd is not None else [])
            try:
                ready, _, _ = select.select(watched, [], [], self._timeout(now))
            except InterruptedError:
                ready = []
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            if self.code.fd is not None and self.code.fd in ready:
                changed = self.code.changed()
                if changed:
                    self.stopping.append(f"gpuhpc changed on disk ({changed})")
            if self.note_r in ready:
                self._read_notes()
            self._reap()
            self._check_idle_and_socket()

    def _keep_a_spare(self, now: float) -> None:
        """One idle worker, the one that served last, keeps the warmest caches. Fork another
        only when none is idle and the busy ones run a long command (or exited); a submit is
        back well within _REFILL_DELAY, so loops never fork."""
        if (len(self.spares) < _SPARES and len(self.busy) < _MAX_WORKERS
                and (self.refill or all(now - t >= _REFILL_DELAY for t in self.busy.values()))):
            pid = os.fork()
            if pid == 0:
                worker = Worker(self.listener, self.code, self.master_env, self.note_w, self.pid,
                                self.identity, self.log)
                worker.run(self.close_in_worker + ([self.code.fd] if self.code.fd is not None else []))
            self.spares[pid] = now
            self.refill = False

    def _timeout(self, now: float) -> float:
        if len(self.spares) < _SPARES and self.busy:
            return min(1.0, max(0.001, min(self.busy.values()) + _REFILL_DELAY - now))
        return 1.0

    def _read_notes(self) -> None:
        self.pending += os.read(self.note_r, 4096)
        while len(self.pending) >= MESSAGE.size:
            code, pid = unpack(self.pending[:MESSAGE.size])
            self.pending = self.pending[MESSAGE.size:]
            self.last = time.monotonic()
            if code is Msg.ACCEPTED:
                self.spares.pop(pid, None)
                self.busy[pid] = self.last
                self.early_deaths = 0
            elif code is Msg.READY:      # back in accept(): the warmest; retire older idle ones
                self.busy.pop(pid, None)
                self.spares[pid] = self.last
                for old in sorted(self.spares, key=self.spares.get)[:max(0, len(self.spares) - _SPARES)]:
                    if old != pid:
                        _retire(old)
                        del self.spares[old]
                        self.retiring.add(old)
            elif code is Msg.STALE:
                self.stopping.append("gpuhpc's code or config changed")

    def _reap(self) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            was_busy = self.busy.pop(pid, None) is not None
            if pid in self.retiring:
                self.retiring.discard(pid)
            elif pid in self.spares:          # died without accepting
                del self.spares[pid]
                self.early_deaths += 1
                if self.early_deaths >= 5:
                    self.stopping.append("workers keep dying")
            elif was_busy:                    # served a command it could not be reused after
                self.refill = True

    def _check_idle_and_socket(self) -> None:
        if not self.busy and time.monotonic() - self.last > self.idle:
            self.stopping.append(f"idle for {self.idle:g}s")
        try:
            if os.stat(self.sock_path).st_ino != self.inode:
                self.stopping.append("socket replaced")
        except FileNotFoundError:
            self.stopping.append("socket removed")


def _retire(pid: int) -> None:
    try:
        os.kill(pid, RETIRE)
    except ProcessLookupError:
        pass


def _lock(sock_path: str) -> int | None:
    """The server's lock (and pid file), or None if another server holds it."""
    fd = os.open(lock_path(sock_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        _check_lock_file(fd, lock_path(sock_path))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _bind(sock_path: str) -> tuple[socket.socket, int]:
    """A listening socket at ``sock_path`` (mode 0600), replacing a dead server's; its inode."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    old_umask = os.umask(0o177)
    try:
        listener.bind(sock_path)
    finally:
        os.umask(old_umask)
    listener.listen(128)
    return listener, os.stat(sock_path).st_ino


def serve(sock_path: str, idle: float = 900.0, log=None) -> int:
    """Run the master until idle for ``idle`` seconds, SIGTERM, a code or config change, or
    the socket being removed. Returns 0; returns at once if another server holds the lock,
    and 2 if the command server is not enabled (:func:`gpuhpc.config.cmdserver`)."""
    from gpuhpc import config
    from gpuhpc.errors import UserInputError

    events = EventLog(log)
    try:
        setting = config.cmdserver()
    except UserInputError as exc:
        events.say(f"not starting: {exc.one_line()}")
        return 2
    if not setting.enabled:
        events.say(f"not starting: the command server is {setting.reason}")
        return 2
    sock_path = os.path.abspath(sock_path)
    ensure_private_dir(os.path.dirname(sock_path))
    os.chdir("/")                      # keep no directory of the caller's busy
    lock_fd = _lock(sock_path)
    if lock_fd is None:
        return 0
    preload()
    import gc

    code = CodeWatch(list(dict.fromkeys((*config.config_paths(), config.SITE_CONFIG))))   # the site's veto too
    rehearse(code)
    gc.collect()
    gc.freeze()                        # workers' collections skip (and do not touch) all this
    listener, inode = _bind(sock_path)
    os.ftruncate(lock_fd, 0)
    os.write(lock_fd, f"{os.getpid()}\n".encode())
    events.say(f"serving {sock_path} (python {sys.executable}, idle exit after {idle:g}s)")
    master = _Master(sock_path, inode, listener, code, idle, events, [lock_fd])
    try:
        master.run()
    finally:
        events.say(f"stopping: {master.stopping[0] if master.stopping else 'error'}")
        # idle workers notice within a second that the master has gone and exit; they
        # are not killed, so a command that is being accepted right now is still served
        try:
            if os.stat(sock_path).st_ino == inode:
                os.unlink(sock_path)
        except OSError:
            pass
        listener.close()
        code.close()
        os.close(lock_fd)
    return 0


def _check_lock_file(fd: int, path: str) -> os.stat_result:
    """The lock file must be a regular file of this user that no one else may write: a pid
    read from anything else is never signalled."""
    import stat

    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} must be a regular file owned by uid {os.geteuid()} "
                              "that only its owner may write; remove it")
    return st


def _holds_lock(pid: int, st: os.stat_result) -> bool:
    """Is ``pid`` a process of this user holding the flock on the file ``st`` describes
    (``/proc/locks``), that is, the server that wrote its pid there?"""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            uids = next((line.split()[1:] for line in fh if line.startswith("Uid:")), [])
    except OSError:
        return False
    if not uids or any(int(u) != os.geteuid() for u in uids):
        return False
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for line in fh:
                f = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("->" marks a waiter)
                if len(f) >= 6 and f[1] == "FLOCK" and f[3] == "WRITE" and f[4] == str(pid) and f[5] == where:
                    return True
    except OSError:
        return False
    return False


def running_pid(sock_path: str) -> int | None:
    """The pid of the server holding ``sock_path``'s lock, -1 if the lock is held but the
    holder cannot be told, or None. Raises PermissionError when the socket's directory is
    not this user's private directory or the lock file could have been written by another
    user (a pid from there is never trusted)."""
    from gpuhpc.cmdserver import check_private_dir

    if not check_private_dir(os.path.dirname(os.path.abspath(sock_path))):
        return None
    path = lock_path(sock_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(f"{path} is a symbolic link; remove it") from exc
        raise
    try:
        st = _check_lock_file(fd, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            pid = int(text) if text.isdigit() else -1
            return pid if pid > 0 and _holds_lock(pid, st) else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def spawn(sock_path: str, idle: float | None = None, env: dict[str, str] | None = None):
    """Start a detached server (it exits at once if one runs or if it is not enabled);
    returns its Popen."""
    import subprocess

    argv = [sys.executable, "-P", "-m", "gpuhpc.cmdserver", "serve", "--socket", sock_path]
    if idle is not None:
        argv += ["--idle", str(idle)]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env)


def start(sock_path: str, wait: float = 30.0, idle: float | None = None, env: dict[str, str] | None = None) -> int:
    """Start a detached server for this interpreter (no-op if one runs); wait until it
    accepts connections. Returns its pid. The server runs in ``env`` (default: this
    process's environment), which must enable it: else UserInputError, saying why."""
    from gpuhpc import config
    from gpuhpc.errors import UserInputError

    setting = config.cmdserver(env)
    if not setting.enabled:
        raise UserInputError(f"the command server is {setting.reason}", hint=setting.hint or None)
    ensure_private_dir(os.path.dirname(sock_path))
    proc = spawn(sock_path, idle, env) if running_pid(sock_path) is None else None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None and running_pid(sock_path) is None:
            proc = spawn(sock_path, idle, env)     # it stopped at once (its code changed): again
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(sock_path)
            pid = running_pid(sock_path)
            if pid:
                return pid
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                raise
        finally:
            probe.close()
        time.sleep(0.05)
    raise TimeoutError(f"the command server did not come up on {sock_path} within {wait:g}s")


def stop(sock_path: str, wait: float = 10.0) -> int | None:
    """SIGTERM the server (running commands finish on their own); returns its pid or None.
    Only a pid that :func:`running_pid` verified (this user's process holding the lock of
    this user's private directory) is signalled; PermissionError when the directory or the
    lock file is not private."""
    from gpuhpc.errors import GpuhpcError

    try:
        pid = running_pid(sock_path)
    except PermissionError as exc:
        raise GpuhpcError(f"not stopping the command server: {exc}") from exc
    if not pid or pid < 0:
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and running_pid(sock_path):
        time.sleep(0.05)
    return pid
