"""The pre-forking command server behind the C client (design: :mod:`gpuhpc.cmdserver`).

The master imports the CLI once (:data:`PRELOAD`), walks the common path once
(:func:`rehearse`), binds the socket and keeps a forked worker blocked in ``accept()``, so
that no fork happens on a command's critical path. A worker that accepts a connection tells
the master and serves the command. After a ``submit`` that left the process as it found it
(:class:`_State`) the worker goes back to ``accept()``; after anything else it exits. The
master forks another worker only once every worker has been busy for :data:`_REFILL_DELAY`
(concurrent or long commands: ``logs -f`` never blocks others) or one has exited, and when
more than :data:`_SPARES` are idle it retires all but the most recently used (the one with
the warmest caches).

The master stops when idle, on SIGTERM, when gpuhpc's code changes (:class:`CodeWatch`) or
when its socket is removed; idle workers notice within a second and exit, busy ones finish.

Wire format: see ``client.c``.
"""
from __future__ import annotations

import errno
import fcntl
import importlib
import os
import select
import signal
import socket
import struct
import sys
import time

from gpuhpc.cmdserver import PYTHON_VARS, ensure_private_dir, lock_path

MAGIC = b"GPH1"
_HDR = struct.Struct("!4sI")
_MSG = struct.Struct("!ci")          # worker -> client and worker -> master messages
_MAX_REQUEST = 64 << 20              # argv + environment
_MAX_WORKERS = 256
_SPARES = 1                          # idle workers waiting in accept()
_REFILL_DELAY = 0.05                 # fork another once every worker has been busy this long (s)
_RETIRE = signal.SIGRTMIN + 3        # master -> idle worker: exit (never forwarded by the client)
_MAX_REUSE = 500                     # commands one worker serves at most

# imported once by the master so that workers start warm; heavy optional stacks (boto3,
# paramiko) are left to the commands that need them
PRELOAD = ("gpuhpc.cli", "gpuhpc.cli.main", "gpuhpc.cli.submit", "gpuhpc.jobs.spec", "gpuhpc.jobs.render",
           "gpuhpc.jobs.api", "gpuhpc.jobs.checkpoint", "gpuhpc.ledger.hooks", "gpuhpc.ledger.fastpath",
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


def watched_files() -> list[str]:
    """The files whose change makes a server stale: the loaded gpuhpc modules' sources
    (an edit) and the sys.path directories (a ``pip install``)."""
    import gpuhpc

    root = os.path.dirname(os.path.abspath(gpuhpc.__file__))
    paths = {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
    return sorted(p for p in paths if p.startswith(root)) + [p for p in sys.path if p]


def fingerprint(paths: list[str]) -> tuple:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


class CodeWatch:
    """Tells when gpuhpc's code changed after the master imported it, so that no command
    runs stale code: inotify on the directories of the loaded gpuhpc modules and on sys.path
    (read by the master, which then stops), or, where inotify is unavailable, a stat of
    every watched file before each command (:meth:`stale`, in the worker)."""

    _MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800   # modify attrib close_write moved create delete self

    def __init__(self) -> None:
        self.files = watched_files()
        self.fp = fingerprint(self.files)
        self.fd: int | None = None
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            dirs = {os.path.dirname(f) for f in self.files if f.endswith(".py")}
            dirs |= {f for f in self.files if not f.endswith(".py") and os.path.isdir(f)}
            for d in sorted(dirs):
                if libc.inotify_add_watch(fd, os.fsencode(d), self._MASK) < 0:
                    os.close(fd)          # out of watches: stat per command instead
                    return
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = None

    def stale(self) -> bool:
        """Per command, only without inotify."""
        return self.fd is None and fingerprint(self.files) != self.fp

    def changed(self) -> bool:
        """Master: drain inotify; True if a module source or a sys.path entry changed
        (bytecode caches and editors' scratch files do not count)."""
        if self.fd is None:
            return False
        head = struct.Struct("iIII")
        changed = False
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return changed
            i = 0
            while i + head.size <= len(buf):
                _wd, mask, _cookie, length = head.unpack_from(buf, i)
                name = buf[i + head.size:i + head.size + length].rstrip(b"\0").decode(errors="replace")
                i += head.size + length
                is_dir = mask & 0x40000000
                if name and not name.endswith((".py", ".so", ".pth")) and not (
                        is_dir and not name.startswith(".") and name != "__pycache__"):
                    continue              # bytecode, editors' scratch files, caches
                changed = True


def rehearse(code: CodeWatch) -> None:
    """Walk the common command path once without effects: a ``submit --dry-run`` to
    /dev/null, a child process with piped output, the staleness check.

    The master does it once (lazy imports, regex caches); each spare does it again before it
    accepts, because after fork() every first write to a page (CPython writes reference
    counts everywhere) is a copy-on-write fault, and taking those faults while idle keeps
    them off the command's critical path (on this project's VMs a fault costs ~7 us and a
    submit touches ~700 pages)."""
    import subprocess

    code.stale()
    saved = sys.stdout, sys.stderr
    try:
        with open(os.devnull, "w") as null:
            sys.stdout = sys.stderr = null
            from gpuhpc.cli import run_guarded
            from gpuhpc.cli.submit import run

            run_guarded(lambda: run(["--partition", "p", "--gpus", "1", "--time", "1h", "--name", "n",
                                     "--dry-run", "--", "true"]))
        subprocess.run(["true"], input="", capture_output=True, text=True, check=False)
    except BaseException:
        pass
    finally:
        sys.stdout, sys.stderr = saved


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = conn.recv(min(n - got, 1 << 20))
        if not b:
            raise ConnectionError("client went away")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_request(conn: socket.socket):
    """-> (cwd, umask, argv, env) with the client's fds 0, 1, 2 as ``fds``; raises
    ConnectionError/ValueError on anything malformed (the worker then just exits)."""
    fd_size = struct.calcsize("3i")
    data, anc, _flags, _addr = conn.recvmsg(_HDR.size, socket.CMSG_SPACE(fd_size))
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
    try:
        if len(data) < _HDR.size:
            data += _recv_exact(conn, _HDR.size - len(data))
        magic, length = _HDR.unpack(data)
        if magic != MAGIC or length > _MAX_REQUEST or len(fds) != 3:
            raise ValueError("not a gpuhpc client request")
        fields = _recv_exact(conn, length).split(b"\0")
        if fields[-1] != b"":
            raise ValueError("truncated request")
        cwd, umask, argc = os.fsdecode(fields[0]), int(fields[1], 8), int(fields[2])
        argv = [os.fsdecode(a) for a in fields[3:3 + argc]]
        env = {}
        for item in fields[3 + argc:-1]:
            key, sep, value = item.partition(b"=")
            if sep and key:
                env[os.fsdecode(key)] = os.fsdecode(value)
        if len(argv) != argc:
            raise ValueError("truncated argv")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds, cwd, umask, argv, env


def _send(conn: socket.socket, kind: bytes, value: int) -> None:
    conn.sendall(_MSG.pack(kind, value))


def _adopt_stdio(fds: list[int]) -> None:
    """Make the client's descriptors this process's 0, 1, 2 and rebuild sys.std* on them
    (line-buffered on a terminal, as CPython does)."""
    import io

    for target, fd in enumerate(fds):
        os.dup2(fd, target, inheritable=True)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    sys.stdin = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding="utf-8", errors="strict")
    sys.stdout = io.TextIOWrapper(io.open(1, "wb", closefd=False), encoding="utf-8", errors="strict",
                                  line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.open(2, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _release_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _unwatch_hangup(conn: socket.socket) -> None:
    fcntl.fcntl(conn.fileno(), fcntl.F_SETFL, fcntl.fcntl(conn.fileno(), fcntl.F_GETFL) & ~os.O_ASYNC)
    signal.signal(signal.SIGIO, signal.SIG_DFL)   # O_ASYNC is off: no SIGIO comes


def _watch_hangup(conn: socket.socket) -> None:
    """The client never writes after its request, so readable means it is gone (killed,
    terminal closed): hang the command up as a terminal would. Uses SIGIO on the socket
    (no thread to start on every command)."""
    def on_io(_signum, _frame) -> None:
        try:
            gone = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            os.killpg(os.getpid(), signal.SIGHUP)

    signal.signal(signal.SIGIO, on_io)
    fcntl.fcntl(conn.fileno(), fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(conn.fileno(), fcntl.F_SETFL, fcntl.fcntl(conn.fileno(), fcntl.F_GETFL) | os.O_ASYNC)
    on_io(signal.SIGIO, None)          # it may have gone before we asked


def _run_cli(argv: list[str]) -> int:
    import traceback

    sys.argv = ["gpuhpc", *argv[1:]]
    try:
        from gpuhpc.cli import entry

        code = entry()
    except SystemExit as exc:
        code = exc.code
        if isinstance(code, str):
            sys.stderr.write(code + "\n")
            code = 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    return int(code or 0)


def set_environ(env: dict[str, str]) -> None:
    """Make os.environ (and the C environment) exactly ``env``, touching only what differs."""
    current = os.environ
    for key in [k for k in current if k not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


class _State:
    """What a command may leave behind in a worker. A worker serves further commands only
    after a ``submit`` that left all of it as it was (the fast path is stdlib-only and keeps
    no state); anything else, and the worker exits, so that every command starts as clean
    as a fresh process would."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGWINCH)

    def __init__(self) -> None:
        import atexit
        import threading

        self.modules = len(sys.modules)
        self.atexit = atexit._ncallbacks()
        self.threads = threading.active_count()
        self.handlers = [signal.getsignal(s) for s in self._SIGNALS]
        self.caches = self._cache_sizes()
        self.fds = self._fds()
        self.cwd, self.umask = os.getcwd(), os.umask(0o022)
        os.umask(self.umask)
        self.std = sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__
        self.argv = list(sys.argv)

    @staticmethod
    def _cache_sizes() -> list[int]:
        sizes = []
        for name, mod in list(sys.modules.items()):
            if name.startswith("gpuhpc") and mod is not None:
                for value in list(vars(mod).values()):
                    info = getattr(value, "cache_info", None)
                    if callable(info) and getattr(value, "__module__", None) == name:
                        sizes.append(info().currsize)
        return sizes

    @staticmethod
    def _fds() -> int:
        try:
            return len(os.listdir("/proc/self/fd"))
        except OSError:
            return -1

    def unchanged(self) -> bool:
        import atexit
        import threading

        return (len(sys.modules) == self.modules and atexit._ncallbacks() == self.atexit
                and threading.active_count() == self.threads
                and [signal.getsignal(s) for s in self._SIGNALS] == self.handlers
                and self._cache_sizes() == self.caches and self._fds() == self.fds)

    def restore(self, env: dict[str, str]) -> None:
        (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__) = self.std
        sys.argv = list(self.argv)
        set_environ(env)
        os.umask(self.umask)
        os.chdir(self.cwd)


def serve_one(conn: socket.socket, code: CodeWatch, master_env: dict[str, str], note_w: int,
              clean: _State) -> bool:
    """Worker: serve the command on ``conn``. ``clean`` is the worker's state between
    commands. Returns True when this worker may serve another command (see
    :class:`_State`); False when it must exit."""
    try:
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", cred)[1] != os.geteuid():
            return True
        conn.settimeout(10)
        fds, cwd, umask, argv, env = read_request(conn)
        conn.settimeout(None)
    except (OSError, ValueError):
        return True                       # not a client (a probe, a stranger): nothing ran
    try:
        stale = code.stale()
        if stale or any(env.get(v) != master_env.get(v) for v in PYTHON_VARS):
            _send(conn, b"F", 0)          # nothing ran: the client runs the Python CLI
            if stale:
                os.write(note_w, _MSG.pack(b"S", os.getpid()))
            return not stale
        _send(conn, b"P", os.getpid())
        _adopt_stdio(fds)
        fds = []
        set_environ(env)
        os.umask(umask)
        try:
            os.chdir(cwd)
        except OSError as exc:
            sys.stderr.write(f"error: cannot enter the working directory {cwd}: {exc.strerror}\n")
            _flush_stdio()
            _release_stdio()
            _send(conn, b"X", 1)
            clean.restore(master_env)
            return True
        _watch_hangup(conn)
        code = _run_cli(argv)
        import atexit

        reusable = argv[1:2] == ["submit"] and code != 130 and atexit._ncallbacks() == clean.atexit
        if not reusable:
            try:
                atexit._run_exitfuncs()   # as a CLI process would at exit
            except BaseException:
                pass
        _flush_stdio()
        _unwatch_hangup(conn)
        _release_stdio()                  # EOF for a caller reading our pipes, before X
        _send(conn, b"X", code & 0xFF)
        clean.restore(master_env)
        return reusable
    except BaseException:
        return False
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


class _Retired(Exception):
    pass


_in_accept = False
_retiring = False


def _on_retire(_signum, _frame) -> None:
    """The master has enough idle workers: leave now if idle, else after this command."""
    global _retiring
    _retiring = True
    if _in_accept:
        raise _Retired


def _retire(pid: int) -> None:
    try:
        os.kill(pid, _RETIRE)
    except ProcessLookupError:
        pass


def _worker(listener: socket.socket, code: CodeWatch, master_env: dict[str, str], note_w: int,
            close_fds: list[int], master: int) -> None:
    """A worker's life: warm up, then serve commands until one may have left state behind,
    :data:`_MAX_REUSE` of them, or the master has gone. Never returns."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(_RETIRE, _on_retire)
    signal.set_wakeup_fd(-1)
    for fd in close_fds:
        os.close(fd)
    os.setpgid(0, 0)                      # Ctrl-C on the client reaches sbatch, tail -f ...
    rehearse(code)
    clean = _State()
    listener.settimeout(1.0)
    served = 0
    global _in_accept
    try:
        while served < _MAX_REUSE and not _retiring:
            _in_accept = True
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                _in_accept = False
                if os.getppid() != master:
                    break                 # the master stopped: so do idle workers
                continue
            _in_accept = False
            os.write(note_w, _MSG.pack(b"A", os.getpid()))
            served += 1
            if not serve_one(conn, code, master_env, note_w, clean) or not clean.unchanged() or _retiring:
                break
            os.write(note_w, _MSG.pack(b"R", os.getpid()))
    except BaseException:
        pass
    os._exit(0)


def serve(sock_path: str, idle: float = 900.0, log=None) -> int:
    """Run the master until idle for ``idle`` seconds, SIGTERM, a code change, or the socket
    being removed. Returns 0; returns at once if another server holds the lock."""
    def say(msg: str) -> None:
        if log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {msg}\n")
            log.flush()

    sock_path = os.path.abspath(sock_path)
    ensure_private_dir(os.path.dirname(sock_path))
    os.chdir("/")                      # keep no directory of the caller's busy
    master = os.getpid()
    lock_fd = os.open(lock_path(sock_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        return 0
    preload()
    import gc

    code = CodeWatch()
    rehearse(code)
    gc.collect()
    gc.freeze()                        # workers' collections skip (and do not touch) all this
    master_env = dict(os.environ)
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
    inode = os.stat(sock_path).st_ino
    os.ftruncate(lock_fd, 0)
    os.write(lock_fd, f"{os.getpid()}\n".encode())
    say(f"serving {sock_path} (python {sys.executable}, idle exit after {idle:g}s)")

    note_r, note_w = os.pipe()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    stopping = []
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append("SIGTERM"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    spares: dict[int, float] = {}          # idle workers (in accept) -> idle since
    busy: dict[int, float] = {}            # serving a command -> since
    retiring: set[int] = set()
    early_deaths = 0
    refill = True
    last = time.monotonic()
    pending = b""
    try:
        while not stopping:
            now = time.monotonic()
            # One idle worker, the one that served last, keeps the warmest caches. Fork
            # another only when none is idle and the busy ones run a long command (or exited);
            # a submit is back well within _REFILL_DELAY, so loops never fork.
            if (len(spares) < _SPARES and len(busy) < _MAX_WORKERS
                    and (refill or all(now - t >= _REFILL_DELAY for t in busy.values()))):
                pid = os.fork()
                if pid == 0:
                    _worker(listener, code, master_env, note_w,
                            [note_r, wake_r, wake_w, lock_fd] + ([code.fd] if code.fd is not None else []), master)
                spares[pid] = now
                refill = False
            timeout = 1.0
            if len(spares) < _SPARES and busy:
                timeout = min(1.0, max(0.001, min(busy.values()) + _REFILL_DELAY - now))
            try:
                ready, _, _ = select.select([note_r, wake_r] + ([code.fd] if code.fd is not None else []),
                                            [], [], timeout)
            except InterruptedError:
                ready = []
            if wake_r in ready:
                os.read(wake_r, 4096)
            if code.fd is not None and code.fd in ready and code.changed():
                stopping.append("gpuhpc changed on disk")
            if note_r in ready:
                pending += os.read(note_r, 4096)
                while len(pending) >= _MSG.size:
                    kind, pid = _MSG.unpack(pending[:_MSG.size])
                    pending = pending[_MSG.size:]
                    last = time.monotonic()
                    if kind == b"A":      # accepted a command
                        spares.pop(pid, None)
                        busy[pid] = last
                        early_deaths = 0
                    elif kind == b"R":    # back in accept(): the warmest; retire older idle ones
                        busy.pop(pid, None)
                        spares[pid] = last
                        for old in sorted(spares, key=spares.get)[:max(0, len(spares) - _SPARES)]:
                            if old != pid:
                                _retire(old)
                                del spares[old]
                                retiring.add(old)
                    elif kind == b"S":
                        stopping.append("gpuhpc changed on disk")
            while True:                      # reap
                try:
                    pid, _status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                was_busy = busy.pop(pid, None) is not None
                if pid in retiring:
                    retiring.discard(pid)
                elif pid in spares:          # died without accepting
                    del spares[pid]
                    early_deaths += 1
                    if early_deaths >= 5:
                        stopping.append("workers keep dying")
                elif was_busy:               # served a command it could not be reused after
                    refill = True
            if not busy and time.monotonic() - last > idle:
                stopping.append(f"idle for {idle:g}s")
            try:
                if os.stat(sock_path).st_ino != inode:
                    stopping.append("socket replaced")
            except FileNotFoundError:
                stopping.append("socket removed")
    finally:
        say(f"stopping: {stopping[0] if stopping else 'error'}")
        # idle workers notice within a second that the master has gone and exit; they
        # are not killed, so a command that is being accepted right now is still served
        try:
            if os.stat(sock_path).st_ino == inode:
                os.unlink(sock_path)
        except OSError:
            pass
        listener.close()
        if code.fd is not None:
            os.close(code.fd)
        os.close(lock_fd)
    return 0


def running_pid(sock_path: str) -> int | None:
    """The pid of the server holding ``sock_path``'s lock, or None."""
    try:
        fd = os.open(lock_path(sock_path), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def start(sock_path: str, wait: float = 30.0, idle: float | None = None) -> int:
    """Start a detached server for this interpreter (no-op if one runs); wait until it
    accepts connections. Returns its pid."""
    import subprocess

    ensure_private_dir(os.path.dirname(sock_path))
    pid = running_pid(sock_path)
    if pid is None:
        argv = [sys.executable, "-P", "-m", "gpuhpc.cmdserver", "serve", "--socket", sock_path]
        if idle is not None:
            argv += ["--idle", str(idle)]
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
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
    """SIGTERM the server (running commands finish on their own); returns its pid or None."""
    pid = running_pid(sock_path)
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
