"""Compile ``client.c`` for this interpreter and install it in place of the ``gpuhpc``
console script (``gpuhpc cmdserver install-client``), or put the console script back
(``gpuhpc cmdserver uninstall-client``). The interpreter path and server id are baked into
the binary; the console script it replaces is kept next to it as ``.gpuhpc.console-script``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from gpuhpc.cmdserver import server_id
from gpuhpc.errors import GpuhpcError, UserInputError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client.c")

# what pip writes for the console script [project.scripts] gpuhpc = "gpuhpc.cli:entry"
_CONSOLE_SCRIPT = """#!{python}
import sys
from gpuhpc.cli import entry
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(entry())
"""


def default_dest() -> str:
    """Where pip put the ``gpuhpc`` console script for this interpreter."""
    return os.path.join(sysconfig.get_path("scripts"), "gpuhpc")


def backup_path(dest: str) -> str:
    """Where :func:`install` keeps the console script it replaced."""
    return os.path.join(os.path.dirname(os.path.abspath(dest)), f".{os.path.basename(dest)}.console-script")


def kind(path: str) -> str:
    """'compiled client', 'python script' or 'missing'."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return "missing"
    return "compiled client" if head == b"\x7fELF" else "python script"


def _c_string(text: str) -> str:
    if any(c in text for c in '"\\') or not text.isprintable():
        raise UserInputError(f"cannot bake {text!r} into the client (quotes, backslashes or "
                             "control characters)", field="python")
    return f'"{text}"'


def build(dest: str | None = None, cc: str | None = None, python: str | None = None) -> str:
    """Compile the client to ``dest`` (atomically replacing what is there). Tries a static
    binary first (the fastest to start), then a dynamic one. Returns ``dest``."""
    dest = os.path.abspath(dest or default_dest())
    python = python or sys.executable
    cc = cc or os.environ.get("CC") or "cc"
    if not os.path.isdir(os.path.dirname(dest)):
        raise UserInputError(f"{os.path.dirname(dest)} is not a directory", field="--dest")
    defs = [f"-DGPUHPC_PYTHON={_c_string(python)}", f"-DGPUHPC_SERVER_ID={_c_string(server_id(python))}"]
    fd, tmp = tempfile.mkstemp(prefix=".gpuhpc-client-", dir=os.path.dirname(dest))
    os.close(fd)
    try:
        errors = ""
        for extra in (["-static"], []):
            argv = [cc, "-std=c99", "-O2", "-Wall", "-Wextra", *extra, *defs, "-o", tmp, SOURCE]
            try:
                res = subprocess.run(argv, capture_output=True, text=True)
            except FileNotFoundError as exc:
                raise GpuhpcError(f"no C compiler {cc!r} (apt-get install gcc, or pass --cc)") from exc
            if res.returncode == 0:
                break
            errors = res.stderr.strip()
        else:
            raise GpuhpcError(f"compiling the client failed: {errors.splitlines()[-1] if errors else '?'}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def install(dest: str | None = None, cc: str | None = None) -> str:
    """Build the client over ``dest`` (default: this install's console script), keeping the
    script it replaces in :func:`backup_path`. Returns ``dest``."""
    dest = os.path.abspath(dest or default_dest())
    if kind(dest) == "python script":
        shutil.copy2(dest, backup_path(dest))
    return build(dest, cc=cc)


def uninstall(dest: str | None = None, python: str | None = None) -> bool:
    """Put the Python console script back at ``dest`` if the compiled client is there: the
    one :func:`install` kept, else a fresh one for ``python``. Returns True if it changed
    anything."""
    from gpuhpc.fsutil import write_atomic

    dest = os.path.abspath(dest or default_dest())
    if kind(dest) != "compiled client":
        return False
    backup = backup_path(dest)
    if kind(backup) == "python script":
        os.replace(backup, dest)
    else:
        write_atomic(dest, _CONSOLE_SCRIPT.format(python=python or sys.executable), mode=0o755)
    return True
