#!/usr/bin/env python3
"""CLI start-up without a command server: ``gpuhpc --help``, ``gpuhpc status ID`` and
``gpuhpc jobs`` (each a fresh process) against ``python -c pass`` measured in the same run
(goal: <= 6x each; the ratios are printed, never asserted).

    python bench/cli_startup.py [-n 30] [--partition cpu]

``gpuhpc`` runs the way ``pip install`` leaves it: a console script (the very text pip
writes, calling ``gpuhpc.cli:entry``) under this interpreter, with bytecode cached, so a
compiled client or command server on PATH does not change the figure. ``status`` asks about
a job this script submits held (``--hold``) and cancels by id at the end. The commands run
interleaved, round after round, so that every one sees the same load; the median of each is
divided by the median of ``python -c pass``. ``submit --dry-run``, ``cluster status`` (a
typer group that draws rich tables), raw ``squeue`` of the jobs ``gpuhpc jobs`` lists (its
time grows with their number, which is printed) and ``gpuhpc jobs`` of a user without jobs
(``nobody``: start-up and one squeue, no listing) are shown for information.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# what pip (distlib's ScriptMaker) writes for `gpuhpc = "gpuhpc.cli:entry"`
CONSOLE_SCRIPT = """# -*- coding: utf-8 -*-
import re
import sys
from gpuhpc.cli import entry
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(entry())
"""


def _run(argv: list[str], env: dict[str, str], check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if check and res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return dt, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="runs of each command (default 30)")
    ap.add_argument("--partition", default="cpu", help="where the held job for `status` goes")
    args = ap.parse_args()

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="gpuhpc-bench-")
    script = os.path.join(tmp, "gpuhpc")
    with open(script, "w") as fh:
        fh.write(CONSOLE_SCRIPT)
    env = dict(os.environ, GPUHPC_LOG_DIR=tmp, GPUHPC_LEDGER="off",
               PYTHONPATH=os.pathsep.join([pkg, *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("GPUHPC_SSH_HOST", None)
    # measure what a user gets: bytecode cached (some sandboxes export PYTHONDONTWRITEBYTECODE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(pkg, "gpuhpc")], env=env, check=False)
    gpuhpc = [sys.executable, script]

    _, sub = _run([*gpuhpc, "submit", "--partition", args.partition, "--time", "5m", "--hold",
                   "--name", "gpuhpc-bench-startup", "--", "true"], env)
    job_id = sub.stdout.strip().splitlines()[-1]
    user = getpass.getuser()
    listed = len(json.loads(_run([*gpuhpc, "jobs", "--json"], env)[1].stdout))
    try:
        variants = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "gpuhpc --help": [*gpuhpc, "--help"],
            f"gpuhpc status {job_id}": [*gpuhpc, "status", job_id],
            "gpuhpc jobs": [*gpuhpc, "jobs"],
            "squeue of the same jobs (info)": ["squeue", "--states=all", f"--user={user}"],
            "gpuhpc jobs --user nobody (info)": [*gpuhpc, "jobs", "--user", "nobody"],
            "gpuhpc submit --dry-run (info)": [*gpuhpc, "submit", "--gpus", "1", "--dry-run", "--", "true"],
            "gpuhpc cluster status (info)": [*gpuhpc, "cluster", "status"],
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        for argv in variants.values():         # warm the page cache and the bytecode
            _run(argv, env)
        for _ in range(args.n):
            for name, argv in variants.items():
                times[name].append(_run(argv, env)[0])
    finally:
        _run([*gpuhpc, "cancel", job_id], env, check=False)

    base = statistics.median(times["python -c pass"])
    print(f"CLI start-up, {args.n} runs each, interleaved; ratio = median / median of python -c pass; "
          f"`gpuhpc jobs` listed {listed} jobs")
    print(f"{'command':<36} {'median ms':>10} {'min ms':>8} {'ratio':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        goal = "" if name == "python -c pass" or "(info)" in name else "  (goal <= 6x)"
        print(f"{name:<36} {med * 1e3:>10.1f} {min(ts) * 1e3:>8.1f} {med / base:>6.1f}x{goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
