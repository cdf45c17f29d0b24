"""The state check: may a worker serve another command after this one?"""
from __future__ import annotations

import os
import signal
import sys


def set_environ(env: dict[str, str]) -> None:
    """Make os.environ (and the C environment) exactly ``env``, touching only what differs."""
    current = os.environ
    for key in [k for k in current if k not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


class WorkerState:
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

    def reusable_after(self, argv: list[str], code: int) -> bool:
        """After the command ``argv`` exited with ``code``: may this worker go on? Only a
        ``submit`` that was not interrupted and registered no atexit hook (the rest of the
        state is checked by :meth:`unchanged` once the command's output is flushed)."""
        import atexit

        return argv[1:2] == ["submit"] and code != 130 and atexit._ncallbacks() == self.atexit

    def restore(self, env: dict[str, str]) -> None:
        (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__) = self.std
        sys.argv = list(self.argv)
        set_environ(env)
        os.umask(self.umask)
        os.chdir(self.cwd)
