"""Code watching: a server must not run commands with stale code or settings."""
from __future__ import annotations

import os
import struct
import sys


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
    """Tells when gpuhpc's code or config changed after the master read it, so that no
    command runs stale code and a change of setting (the site forbids the server, the user
    turns it off) takes effect at the next command: inotify on the directories of the loaded
    gpuhpc modules and on sys.path (read by the master, which then stops), or, where inotify
    is unavailable, a stat of every watched file before each command (:meth:`stale`, in the
    worker). The config files (``config``; their directories may not exist) are always
    stat-checked per command: two ``stat`` calls."""

    _MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800   # modify attrib close_write moved create delete self

    def __init__(self, config: list[str] | tuple[str, ...] = ()) -> None:
        self.files = watched_files()
        self.fp = fingerprint(self.files)
        self.config = list(config)
        self.config_fp = fingerprint(self.config)
        self.fd: int | None = None
        self._dirs: dict[int, str] = {}   # inotify watch -> directory
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            dirs = {os.path.dirname(f) for f in self.files if f.endswith(".py")}
            dirs |= {f for f in self.files if not f.endswith(".py") and os.path.isdir(f)}
            for d in sorted(dirs):
                wd = libc.inotify_add_watch(fd, os.fsencode(d), self._MASK)
                if wd < 0:
                    os.close(fd)          # out of watches: stat per command instead
                    return
                self._dirs[wd] = d
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = None

    def stale(self) -> bool:
        """Per command (the code's files only without inotify)."""
        return (fingerprint(self.config) != self.config_fp
                or (self.fd is None and fingerprint(self.files) != self.fp))

    def changed(self) -> str | None:
        """Master: drain inotify; the path of a module source or sys.path entry that
        changed, if any (bytecode caches and editors' scratch files do not count)."""
        if self.fd is None:
            return None
        head = struct.Struct("iIII")
        changed = None
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return changed
            i = 0
            while i + head.size <= len(buf):
                wd, mask, _cookie, length = head.unpack_from(buf, i)
                name = buf[i + head.size:i + head.size + length].rstrip(b"\0").decode(errors="replace")
                i += head.size + length
                is_dir = mask & 0x40000000
                if name and not name.endswith((".py", ".so", ".pth")) and not (
                        is_dir and not name.startswith(".") and name != "__pycache__"):
                    continue              # bytecode, editors' scratch files, caches
                changed = changed or os.path.join(self._dirs.get(wd, "?"), name)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
