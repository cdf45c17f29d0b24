#!/usr/bin/env python3
"""CLI start-up without a command server: ``gpuhpc --help``, ``gpuhpc status ID`` (a live job
and a finished one) and ``gpuhpc jobs`` (each a fresh process) against ``python -c pass``
measured in the same run (goal: <= 6x each; the ratios are printed, never asserted), and how
many Slurm commands each ran (goal: 1 for ``status``; at most one squeue and one sacct for
``jobs``).

    python bench/cli_startup.py [-n 30] [--partition cpu]

``gpuhpc`` runs the way ``pip install`` leaves it: a console script (the very text pip
writes, calling ``gpuhpc.cli:entry``) under this interpreter, with bytecode cached, so a
compiled client or command server on PATH does not change the figure. ``status`` asks about
a job this script submits held (``--hold``) and cancels by id at the end, and about one it
submits and lets finish (slurmctld still knows it for MinJobAge); ``status`` of a job slurmctld
has forgotten (an older one of yours from sacct, if there is one) is shown for information.
Slurm commands are counted in one extra round through a PATH directory of logging shims
(``squeue``, ``sacct``, ``scontrol``, ...) that exec the real commands; the timed rounds run
without them. The commands run
interleaved, round after round, so that every one sees the same load; the median of each is
divided by the median of ``python -c pass``. ``submit --dry-run``, ``cluster status`` (a
click group that draws rich tables), raw ``squeue`` of the jobs ``gpuhpc jobs`` lists (its
time grows with their number, which is printed) and ``gpuhpc jobs`` of a user without jobs
(``nobody``: start-up and one squeue, no listing) are shown for information.

``--transports`` (issue 37: Slurm >= 23.02, e.g. the 25.11 build of ``scripts/slurm_build.sh``
with its bin/sbin first on PATH and ``SLURM_CONF`` set): ``gpuhpc jobs`` and ``gpuhpc status``
once per transport of ``SlurmClient`` (``GPUHPC_SLURM_TRANSPORT`` = pyslurm, json, cli) in the
same interleaved rounds (goal with pyslurm: <= 3x ``python -c pass``); ``--pyslurm-dir DIR`` puts
a pyslurm built against that Slurm on PYTHONPATH. A transport that cannot work here is left out
with the one line gpuhpc gives for it.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import resource
import shutil
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


_CPU: list[float] = []        # CPU seconds (user + system) of the last _run's child processes


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(argv: list[str], env: dict[str, str], check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    c0, t0 = _cpu(), time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    _CPU[:] = [_cpu() - c0]
    if check and res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return dt, res


SLURM = ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo", "sacctmgr", "sstat", "sprio", "sshare")


def _shims(tmp: str, env: dict[str, str]) -> tuple[dict[str, str], str]:
    """An environment whose PATH starts with logging shims of the Slurm commands, and the log
    file they append their names to."""
    shim_dir, log = os.path.join(tmp, "slurm-shims"), os.path.join(tmp, "slurm-calls.log")
    os.makedirs(shim_dir)
    for name in SLURM:
        real = shutil.which(name, path=env.get("PATH"))
        if real is None:
            continue
        path = os.path.join(shim_dir, name)
        with open(path, "w") as fh:
            fh.write(f'#!/bin/sh\necho {name} >> "$GPUHPC_BENCH_SLURM_LOG"\nexec {real} "$@"\n')
        os.chmod(path, 0o755)
    return dict(env, PATH=shim_dir + os.pathsep + env.get("PATH", ""), GPUHPC_BENCH_SLURM_LOG=log), log


def _count(argv: list[str], env: dict[str, str], log: str) -> str:
    """Run ``argv`` once through the shims: "N (squeue 1, sacct 1)"."""
    open(log, "w").close()
    _run(argv, env, check=False)
    with open(log) as fh:
        calls = fh.read().split()
    per = {n: calls.count(n) for n in dict.fromkeys(calls)}
    return f"{len(calls)}" + (f" ({', '.join(f'{n} {c}' for n, c in per.items())})" if per else "")


def _old_job(user: str, skip: set[str], env: dict[str, str]) -> str | None:
    """One of ``user``'s jobs from the last week that slurmctld no longer knows, if any."""
    res = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID", "-u", user, "-S", "now-7days"],
                         capture_output=True, text=True, env=env)
    for job in reversed(res.stdout.split()):
        if job.isdigit() and job not in skip:
            if subprocess.run(["scontrol", "show", "job", job], capture_output=True, env=env).returncode != 0:
                return job
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="runs of each command (default 30)")
    ap.add_argument("--partition", default="cpu", help="where the held job for `status` goes")
    ap.add_argument("--transports", action="store_true",
                    help="also `jobs` and `status` through each SlurmClient transport (pyslurm, json, cli)")
    ap.add_argument("--pyslurm-dir", help="a directory with pyslurm in it, put on PYTHONPATH")
    args = ap.parse_args()

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="gpuhpc-bench-")
    script = os.path.join(tmp, "gpuhpc")
    with open(script, "w") as fh:
        fh.write(CONSOLE_SCRIPT)
    env = dict(os.environ, GPUHPC_LOG_DIR=tmp, GPUHPC_LEDGER="off",
               PYTHONPATH=os.pathsep.join([pkg, *filter(None, [args.pyslurm_dir, os.environ.get("PYTHONPATH")])]))
    env.pop("GPUHPC_SSH_HOST", None)
    # measure what a user gets: bytecode cached (some sandboxes export PYTHONDONTWRITEBYTECODE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(pkg, "gpuhpc")], env=env, check=False)
    gpuhpc = [sys.executable, script]

    _, sub = _run([*gpuhpc, "submit", "--partition", args.partition, "--time", "5m", "--hold",
                   "--name", "gpuhpc-bench-startup", "--", "true"], env)
    job_id = sub.stdout.strip().splitlines()[-1]
    _, sub = _run([*gpuhpc, "submit", "--partition", args.partition, "--time", "5m",
                   "--name", "gpuhpc-bench-finished", "--", "true"], env)
    done_id = sub.stdout.strip().splitlines()[-1]
    user = getpass.getuser()
    try:
        deadline = time.monotonic() + 120
        while not json.loads(_run([*gpuhpc, "status", done_id, "--json"], env)[1].stdout)["finished"]:
            if time.monotonic() > deadline:
                raise SystemExit(f"job {done_id} did not finish in 120 s")
            time.sleep(0.5)
        listed = len(json.loads(_run([*gpuhpc, "jobs", "--json"], env)[1].stdout))
        old = _old_job(user, {job_id, done_id}, env)
        variants = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "gpuhpc --help": [*gpuhpc, "--help"],
            f"gpuhpc status {job_id} (live)": [*gpuhpc, "status", job_id],
            f"gpuhpc status {done_id} (finished)": [*gpuhpc, "status", done_id],
            "gpuhpc jobs": [*gpuhpc, "jobs"],
            **({f"gpuhpc status {old} (forgotten, info)": [*gpuhpc, "status", old]} if old else {}),
            "squeue of the same jobs (info)": ["squeue", "--states=all", f"--user={user}"],
            "gpuhpc jobs --user nobody (info)": [*gpuhpc, "jobs", "--user", "nobody"],
            "gpuhpc submit --dry-run (info)": [*gpuhpc, "submit", "--gpus", "1", "--dry-run", "--", "true"],
            "gpuhpc cluster status (info)": [*gpuhpc, "cluster", "status"],
        }
        envs: dict[str, dict[str, str]] = {}           # a variant's own environment (a transport)
        if args.transports:
            for transport in ("pyslurm", "json", "cli"):
                t_env = dict(env, GPUHPC_SLURM_TRANSPORT=transport)
                probe = _run([*gpuhpc, "jobs"], t_env, check=False)[1]
                if probe.returncode != 0:
                    print(f"[{transport}] left out: {probe.stderr.strip().splitlines()[-1:]}")
                    continue
                for name, argv in ((f"gpuhpc jobs [{transport}]", [*gpuhpc, "jobs"]),
                                   (f"gpuhpc status {job_id} (live) [{transport}]", [*gpuhpc, "status", job_id])):
                    variants[name], envs[name] = argv, t_env
        times: dict[str, list[float]] = {k: [] for k in variants}
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        for name, argv in variants.items():    # warm the page cache and the bytecode
            _run(argv, envs.get(name, env))
        shim_env, log = _shims(tmp, env)
        counts = {k: _count(argv, {**shim_env, **{x: v for x, v in envs.get(k, {}).items()
                                                  if x == "GPUHPC_SLURM_TRANSPORT"}}, log)
                  if k.startswith("gpuhpc") else "" for k, argv in variants.items()}
        for _ in range(args.n):
            for name, argv in variants.items():
                times[name].append(_run(argv, envs.get(name, env))[0])
                cpu[name].append(_CPU[0])
    finally:
        _run([*gpuhpc, "cancel", job_id], env, check=False)

    base = statistics.median(times["python -c pass"])
    cbase = statistics.median(cpu["python -c pass"])
    print(f"CLI start-up, {args.n} runs each, interleaved; ratio = median / median of python -c pass; "
          f"`gpuhpc jobs` listed {listed} jobs")
    print("(cpu: median CPU time of the process and its children, user + system, against python -c pass's: "
          "what a busy machine's load does not inflate)")
    print(f"{'command':<44} {'median ms':>10} {'min ms':>8} {'ratio':>7}  {'goal':<6} {'cpu ratio':>9}  Slurm commands")
    for name, ts in times.items():
        med = statistics.median(ts)
        goal = "" if name == "python -c pass" or "info)" in name else "<= 3x" if "[pyslurm]" in name else "<= 6x"
        cratio = statistics.median(cpu[name]) / cbase
        print(f"{name:<44} {med * 1e3:>10.1f} {min(ts) * 1e3:>8.1f} {med / base:>6.1f}x  {goal:<6} {cratio:>8.1f}x  "
              f"{counts[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
