"""One exit-code rule for every command: a malformed argument is bad input (exit 2), a
well-formed one naming something that does not exist is a missing thing (exit 1; those need the
cluster: tests/integration/core/test_exit_codes.py). Either way one line on stderr, starting
``error:``, and no traceback. Nothing here reaches Slurm, a database or S3: each malformed
argument is refused before."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuhpc.cli.main import COMMANDS

# (argv, what the line must name) -- a malformed argument per command
MALFORMED = [
    (["submit", "--gpus", "x", "--", "true"], "--gpus"),
    (["jobs", "--bogus"], "--bogus"),
    (["status", "12x"], "job_id"),
    (["logs", "x"], "job_id"),
    (["cancel", "1x"], "job_id"),
    (["shell", "--gpus", "x", "--", "true"], "--gpus"),
    (["conf", "render", "spec.yaml"], "--out"),
    (["cluster", "trust"], "NAME"),
    (["db", "upgrade", "--bogus"], "--bogus"),
    (["ledger", "price", "load", "/nonexistent/prices.yaml"], "FILE"),
    (["report", "efficiency", "x"], "JOBID"),
    (["quota", "show", "--bogus"], "--bogus"),
    (["topology", "synth", "--levels", "two"], "--levels"),
    (["node", "health", "--mode", "fast"], "--mode"),
    (["stage", "pull", "notaurl"], "URL"),
    (["sweep", "status", "x"], "ID"),
    (["report-metric", "1x", "3"], "NAME"),
    (["cmdserver", "start", "--idle", "0"], "--idle"),
    (["completion", "tcsh"], "tcsh"),
    (["sprint", "/nonexistent/sprint.yaml"], "FILE"),
    (["placement", "12x"], "JOBID"),
    (["image", "pin", "nvcr.io/nvidia/pytorch:24.05-py3"], "REF"),
    (["profile", "12x"], "JOBID"),
    (["power", "resume", "spot[01"], "HOSTLIST"),
    (["nosuch"], "nosuch"),
]


def test_every_command_has_a_malformed_case():
    assert {argv[0] for argv, _ in MALFORMED} >= set(COMMANDS)


@pytest.mark.parametrize("argv,names", MALFORMED, ids=[" ".join(a) for a, _ in MALFORMED])
def test_a_malformed_argument_exits_2_with_one_line(argv, names, tmp_path):
    env = {**os.environ, "GPUHPC_DATA_DIR": str(tmp_path), "GPUHPC_LEDGER": "off"}
    env.pop("GPUHPC_DEBUG", None)
    res = subprocess.run([sys.executable, "-m", "gpuhpc", *argv], capture_output=True, text=True, timeout=60,
                         env=env, cwd=tmp_path)
    assert res.returncode == 2, (argv, res.stderr)
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert names in res.stderr and "Traceback" not in res.stderr
    assert res.stdout == ""


# well-formed names of things the ledger (a SQLite file here, nothing running) does not have
MISSING_IN_LEDGER = [
    (["quota", "show", "nosuch"], "no account 'nosuch'"),
    (["ledger", "user", "add", "bob", "--account", "nosuch"], "no account 'nosuch'"),
    (["sweep", "status", "99999"], "no sweep 99999"),
]


def test_a_missing_thing_in_the_ledger_exits_1_with_one_line(tmp_path):
    env = {**os.environ, "GPUHPC_DATA_DIR": str(tmp_path)}
    for k in ("GPUHPC_DEBUG", "GPUHPC_DB_URL", "GPUHPC_LEDGER"):
        env.pop(k, None)
    run = lambda *argv: subprocess.run([sys.executable, "-m", "gpuhpc", *argv], capture_output=True,  # noqa: E731
                                       text=True, timeout=60, env=env, cwd=tmp_path)
    assert run("db", "upgrade").returncode == 0
    for argv, says in MISSING_IN_LEDGER:
        res = run(*argv)
        assert res.returncode == 1, (argv, res.stderr)
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
        assert says in res.stderr and "Traceback" not in res.stderr
