"""A worker: forked by the master, it waits in ``accept()`` and serves commands as the
caller, until one may have left state behind (:class:`~gpuhpc.cmdserver.state.WorkerState`).

A request is served only if the caller is set up exactly as the worker is: same code and
config (:class:`~gpuhpc.cmdserver.codewatch.CodeWatch`), same ``PYTHON*`` variables, same
uid, gid, supplementary groups and resource limits
(:class:`~gpuhpc.cmdserver.protocol.Identity`), because a job inherits those from the process
that runs ``sbatch``. Otherwise the worker declines and the client runs the Python CLI itself.
"""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
import sys
import time

from gpuhpc.cmdserver import PYTHON_VARS
from gpuhpc.cmdserver.codewatch import CodeWatch
from gpuhpc.cmdserver.protocol import Decline, Identity, Msg, Request, pack, read_request, send
from gpuhpc.cmdserver.state import WorkerState, set_environ

RETIRE = signal.SIGRTMIN + 3         # master -> idle worker: exit (never forwarded by the client)
MAX_REUSE = 500                      # commands one worker serves at most


class EventLog:
    """One line per event, appended with a single write (workers share the file)."""

    def __init__(self, fh=None) -> None:
        self.fd = fh.fileno() if fh is not None else None
        self._fh = fh                     # keeps the descriptor open

    def say(self, msg: str) -> None:
        if self.fd is None:
            return
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {msg}\n"
        try:
            os.write(self.fd, line.encode(errors="backslashreplace"))
        except OSError:
            pass


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
            from gpuhpc.cli.main import run_guarded
            from gpuhpc.cli.submit import run

            run_guarded(lambda: run(["--partition", "p", "--gpus", "1", "--time", "1h", "--name", "n",
                                     "--dry-run", "--", "true"]))
        subprocess.run(["true"], input="", capture_output=True, text=True, check=False)
    except BaseException:
        pass
    finally:
        sys.stdout, sys.stderr = saved


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


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


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


class _Retired(Exception):
    pass


class Worker:
    """One forked worker. ``note_w`` is the pipe to the master (:class:`Msg` ACCEPTED, READY,
    STALE); ``master_env`` the environment every command's is restored to."""

    def __init__(self, listener: socket.socket, code: CodeWatch, master_env: dict[str, str], note_w: int,
                 master: int, identity: Identity, log: EventLog) -> None:
        self.listener, self.code, self.master_env, self.note_w = listener, code, master_env, note_w
        self.master, self.identity, self.log = master, identity, log
        self.in_accept = False
        self.retiring = False

    def _on_retire(self, _signum, _frame) -> None:
        """The master has enough idle workers: leave now if idle, else after this command."""
        self.retiring = True
        if self.in_accept:
            raise _Retired

    def _note(self, code: Msg) -> None:
        os.write(self.note_w, pack(code, os.getpid()))

    def run(self, close_fds: list[int]) -> None:
        """A worker's life: warm up, then serve commands until one may have left state
        behind, :data:`MAX_REUSE` of them, or the master has gone. Never returns."""
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(RETIRE, self._on_retire)
        signal.set_wakeup_fd(-1)
        for fd in close_fds:
            os.close(fd)
        os.setpgid(0, 0)                      # Ctrl-C on the client reaches sbatch, tail -f ...
        rehearse(self.code)
        clean = WorkerState()
        self.listener.settimeout(1.0)
        served = 0
        try:
            while served < MAX_REUSE and not self.retiring:
                self.in_accept = True
                try:
                    conn, _ = self.listener.accept()
                except TimeoutError:
                    self.in_accept = False
                    if os.getppid() != self.master:
                        break                 # the master stopped: so do idle workers
                    continue
                self.in_accept = False
                self._note(Msg.ACCEPTED)
                served += 1
                if not self.serve_one(conn, clean) or not clean.unchanged() or self.retiring:
                    break
                self._note(Msg.READY)
        except BaseException:
            pass
        os._exit(0)

    def check(self, req: Request) -> tuple[Decline, str] | None:
        """None if this worker may serve ``req``; else why not."""
        if self.code.stale():
            return Decline.STALE, "gpuhpc's code or config changed"
        for var in PYTHON_VARS:
            if req.env.get(var) != self.master_env.get(var):
                return Decline.PYTHON_ENV, f"{var} differs"
        return self.identity.mismatch(req.identity)

    def serve_one(self, conn: socket.socket, clean: WorkerState) -> bool:
        """Serve the command on ``conn``. ``clean`` is the worker's state between commands.
        Returns True when this worker may serve another command (see :class:`WorkerState`);
        False when it must exit."""
        fds: list[int] = []
        try:
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", cred)[1] != os.geteuid():
                return True
            conn.settimeout(10)
            fds, req = read_request(conn)
            conn.settimeout(None)
        except (OSError, ValueError):
            return True                       # not a client (a probe, a stranger): nothing ran
        try:
            declined = self.check(req)
            if declined:
                reason, why = declined
                send(conn, Msg.DECLINED, reason)  # nothing ran: the client runs the Python CLI
                self.log.say(f"declined {' '.join(req.argv[1:2]) or '(no command)'}: "
                             f"{reason.name.lower()}: {why}")
                if reason is Decline.STALE:
                    self._note(Msg.STALE)
                    return False
                return True
            return self._run(conn, fds, req, clean)
        except BaseException:
            return False
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            conn.close()

    def _run(self, conn: socket.socket, fds: list[int], req: Request, clean: WorkerState) -> bool:
        send(conn, Msg.STARTED, os.getpid())
        _adopt_stdio(fds)
        fds.clear()
        set_environ(req.env)
        os.umask(req.umask)
        try:
            os.chdir(req.cwd)
        except OSError as exc:
            sys.stderr.write(f"error: cannot enter the working directory {req.cwd}: {exc.strerror}\n")
            _flush_stdio()
            _release_stdio()
            send(conn, Msg.EXITED, 1)
            clean.restore(self.master_env)
            return True
        _watch_hangup(conn)
        code = _run_cli(req.argv)
        reusable = clean.reusable_after(req.argv, code)
        if not reusable:
            import atexit

            try:
                atexit._run_exitfuncs()   # as a CLI process would at exit
            except BaseException:
                pass
        _flush_stdio()
        _unwatch_hangup(conn)
        _release_stdio()                  # EOF for a caller reading our pipes, before EXITED
        send(conn, Msg.EXITED, code & 0xFF)
        clean.restore(self.master_env)
        return reusable
