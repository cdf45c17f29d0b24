"""Recording command wrappers for integration tests (tests/ is on sys.path through its conftest.py).

``record_calls(bin_dir, "sbatch")`` writes ``bin_dir/sbatch``: a script that appends its argv to a
log and then execs the real ``sbatch`` (found on PATH now), stdin and all. Put ``bin_dir`` first
on PATH (of the process under test, or of this one: its subprocesses inherit it); the returned
function reads the calls so far. A test that says "X never reached sbatch" asserts that the list
is empty, and proves the wrapper is on the path it tests by seeing one call that does reach it.
"""
from __future__ import annotations

import shlex
import shutil
import stat
from collections.abc import Callable
from pathlib import Path


def record_calls(bin_dir: Path, tool: str) -> Callable[[], list[list[str]]]:
    """A recording ``tool`` in ``bin_dir``; returns ``calls()``: each call's argv (without argv[0])."""
    real = shutil.which(tool)
    assert real, f"{tool} is not on PATH"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = bin_dir / f"{tool}.calls"
    log.write_bytes(b"")
    script = bin_dir / tool
    # one record per call: the argument count, then each argument, NUL-terminated (any byte but NUL)
    script.write_text(f"""#!/bin/bash
exec 9>>{shlex.quote(str(log))}
flock 9
printf '%s\\0' "$#" "$@" >&9
exec 9>&-
exec {shlex.quote(real)} "$@"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def calls() -> list[list[str]]:
        fields = log.read_bytes().decode(errors="replace").split("\0")[:-1]
        out, i = [], 0
        while i < len(fields):
            n = int(fields[i])
            out.append(fields[i + 1:i + 1 + n])
            i += 1 + n
        return out

    return calls
