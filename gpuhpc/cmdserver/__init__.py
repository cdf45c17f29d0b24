"""An opt-in command server for the gpuhpc CLI, in the manner of Mercurial's ``chg``.

A CPython CLI pays 10-20 ms of interpreter start-up and 30-60 ms of imports before it does
anything, several times the cost of ``sbatch`` itself. For scripted submission (sweeps,
pipelines, job arrays built in a loop) gpuhpc therefore ships an optional split front-end,
off by default: a user turns it on with ``[cmdserver] enabled = true`` in their config and
``gpuhpc cmdserver install-client``; a site forbids it with ``[cmdserver] allowed = false``
in ``/etc/gpuhpc/config.toml`` (:mod:`gpuhpc.config`).

* ``client.c`` is a ~300-line C program installed as ``gpuhpc`` by
  ``gpuhpc cmdserver install-client`` (in place of the console script, which
  ``uninstall-client`` puts back). It connects to a per-user Unix socket and hands over argv,
  environment, cwd, umask, uid/gid, groups, resource limits and its stdin/stdout/stderr
  descriptors (SCM_RIGHTS), forwards signals (Ctrl-C) to the command's process group and
  exits with the command's exit code (wire format: :mod:`~gpuhpc.cmdserver.protocol`).
* :mod:`gpuhpc.cmdserver.server` is a pre-forking Python server: the master imports the CLI
  once and keeps one forked worker (:mod:`~gpuhpc.cmdserver.worker`) blocked in ``accept()``.
  A worker serves a command only for a caller with its own uid, gid, supplementary groups
  and resource limits (a job inherits those from the process that runs ``sbatch``), in the
  client's cwd and environment, writing straight to the client's terminal or pipes.

The client falls back to the plain Python CLI (``python -P -m gpuhpc``) whenever the server
cannot be used: none running (``python -m gpuhpc.cmdserver autostart`` then runs the command
and starts a server in the background if the config enables one, unless
``GPUHPC_CMDSERVER=noautostart``), ``GPUHPC_CMDSERVER=off``, a socket directory that is not
private to the user, a server of another user, a caller whose ids, groups, limits or
``PYTHON*`` variables differ from the server's, or gpuhpc's code or config changed since the
server started (the server then exits). The server exits after ``GPUHPC_CMDSERVER_IDLE``
seconds without a command (default 900) or on ``gpuhpc cmdserver stop``.

Sockets live in ``$GPUHPC_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/gpuhpc``, else
``/tmp/gpuhpc-UID`` (created 0700; refused by every command, ``stop`` and ``status``
included, if it is not the user's own private directory: another user may pre-create
``/tmp/gpuhpc-0``),
named ``cmd-ID.sock`` with ID derived from the interpreter path, so every install (venv)
has its own server.
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping

# the client passes these to the server; a mismatch means the warm interpreter was set up
# differently from the one the user asked for, so the client runs the Python CLI itself
PYTHON_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUSERBASE",
               "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDEVMODE", "PYTHONWARNINGS", "PYTHONOPTIMIZE",
               "PYTHONPYCACHEPREFIX", "PYTHONINSPECT", "PYTHONVERBOSE", "PYTHONMALLOC")


def server_id(python: str | None = None) -> str:
    """12 hex digits naming the server of the interpreter ``python`` (default: this one)."""
    return hashlib.sha256((python or sys.executable).encode()).hexdigest()[:12]


def runtime_dir(env: Mapping[str, str] | None = None) -> str:
    """Where sockets live (same rule as client.c)."""
    env = os.environ if env is None else env
    from gpuhpc.config import getenv

    if getenv("GPUHPC_RUNTIME_DIR", env):
        return getenv("GPUHPC_RUNTIME_DIR", env)
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "gpuhpc")
    return f"/tmp/gpuhpc-{os.getuid()}"


def socket_path(env: Mapping[str, str] | None = None, python: str | None = None) -> str:
    return os.path.join(runtime_dir(env), f"cmd-{server_id(python)}.sock")


def lock_path(sock: str) -> str:
    return sock[: -len(".sock")] + ".lock" if sock.endswith(".sock") else sock + ".lock"


def ensure_private_dir(path: str) -> None:
    """Create ``path`` 0700 if missing; raise PermissionError unless it is a real directory
    owned by this user and closed to group and others."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)


def check_private_dir(path: str) -> bool:
    """False if ``path`` does not exist; True if it is a real directory (not a symbolic link)
    owned by this user and closed to group and others; else PermissionError: nothing in it
    (a lock file, the pid it names) may be trusted."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must be a directory owned by uid {os.geteuid()} with mode 0700")
    return True
