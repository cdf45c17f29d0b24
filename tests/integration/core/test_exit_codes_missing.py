"""One exit-code rule, on the real cluster: a well-formed argument that names nothing Slurm or
the sweep database knows is a missing thing (exit 1), with one line on stderr and no
traceback (malformed arguments, exit 2: tests/unit/test_exit_codes.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

NO_JOB = "99999999"
NO_SWEEP = "99999"

JOBS = [
    (["status", NO_JOB], "not found"),
    (["logs", NO_JOB], "no log file"),
    (["cancel", NO_JOB], "no such job"),
    (["report", "efficiency", NO_JOB], f"Slurm has no job {NO_JOB}"),
]
# a missing sweep is found missing in the sweep database, before any Slurm command: these run in
# the isolated stream, beside the shared cluster
SWEEPS = [(["sweep", cmd, NO_SWEEP, *extra], f"no sweep {NO_SWEEP}")
          for cmd, extra in (("status", []), ("best", []), ("results", ["--json"]), ("wait", ["--timeout", "1"]),
                             ("resume", []), ("cancel", []), ("report", ["--html", "r.html"]))]
MISSING = [pytest.param(a, s, id=" ".join(a)) for a, s in JOBS] + [
    pytest.param(a, s, id=" ".join(a), marks=pytest.mark.isolated) for a, s in SWEEPS]


@pytest.mark.parametrize("argv,says", MISSING)
def test_a_missing_thing_exits_1_with_one_line(argv, says, tmp_path):
    env = {**os.environ, "GPUHPC_DATA_DIR": str(tmp_path), "GPUHPC_LEDGER": "off"}
    env.pop("GPUHPC_DEBUG", None)
    res = subprocess.run([sys.executable, "-m", "gpuhpc", *argv], capture_output=True, text=True, timeout=120,
                         env=env, cwd=tmp_path)
    assert res.returncode == 1, (argv, res.stderr)
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "r.html").exists()
