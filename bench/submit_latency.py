#!/usr/bin/env python3
"""Submit latency of the pure-Python CLI, one new process per submission (informational),
and what the ledger's quota check adds to it (goal: ledger on / ledger off <= 2x).

    python bench/submit_latency.py [-n 30] [--partition cpu]

Variants, interleaved so that all see the same load, each a fresh process:

* ``sbatch`` of the very script ``gpuhpc submit`` renders (``--dry-run``): the baseline;
* ``gpuhpc submit``, ledger off (``GPUHPC_LEDGER=off``);
* ``gpuhpc submit``, ledger on: a fresh SQLite ledger with a price and a quota on the account,
  so every submission runs the quota decision (reserve, commit, sbatch, attach);
* ``python -c pass``: the interpreter's own start-up, the floor of any CPython CLI.

``gpuhpc`` is pip's console script next to this interpreter (``python -m gpuhpc`` if there is
none), with ``GPUHPC_CMDSERVER=off``. Jobs are submitted held (``--hold``) and cancelled by id
at the end. Prints median and mean wall time per variant, each ratio to sbatch, and the
ledger-on / ledger-off ratio.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} failed: {res.stderr.strip()}")
    out = res.stdout.strip().splitlines()
    return dt, out[-1].split(";")[0] if out else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="submissions per variant (default 30)")
    ap.add_argument("--partition", default="cpu")
    args = ap.parse_args()

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script_bin = os.path.join(os.path.dirname(sys.executable), "gpuhpc")
    gpuhpc = [script_bin] if os.access(script_bin, os.X_OK) else [sys.executable, "-m", "gpuhpc"]
    tmp = tempfile.mkdtemp(prefix="gpuhpc-bench-")
    env = dict(os.environ, GPUHPC_LOG_DIR=tmp, GPUHPC_CMDSERVER="off", GPUHPC_DATA_DIR=os.path.join(tmp, "off"))
    env["PYTHONPATH"] = os.pathsep.join([pkg, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # measure what a user gets: bytecode cached (some sandboxes export PYTHONDONTWRITEBYTECODE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("GPUHPC_DB_URL", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(pkg, "gpuhpc")], env=env, check=False)
    off_env = dict(env, GPUHPC_LEDGER="off")
    on_env = dict(env, GPUHPC_DATA_DIR=os.path.join(tmp, "ledger"))
    on_env.pop("GPUHPC_LEDGER", None)
    opts = ["--partition", args.partition, "--time", "15m", "--hold", "--name", "gpuhpc-bench"]
    cmd = ["--", "true"]
    # the very script gpuhpc submits, for raw sbatch
    script = os.path.join(tmp, "job.sbatch")
    dry = subprocess.run([*gpuhpc, "submit", *opts, "--dry-run", *cmd], capture_output=True, text=True, env=off_env)
    if dry.returncode != 0:
        raise SystemExit(f"gpuhpc submit --dry-run failed: {dry.stderr.strip()}")
    with open(script, "w") as fh:
        fh.write(dry.stdout)
    # the ledger in use: a fresh SQLite ledger, a price and a quota on the account
    for admin in (["db", "upgrade"], ["ledger", "price", "set", "--gpu-type", "*", "--rate", "1"],
                  ["ledger", "account", "add", "research"], ["quota", "set", "research", "--gpu-hours", "1000000"]):
        subprocess.run([*gpuhpc, *admin], env=on_env, capture_output=True, check=True)

    variants = {
        "sbatch": (["sbatch", "--parsable", script], env),
        "gpuhpc submit, ledger off": ([*gpuhpc, "submit", *opts, "--account", "research", *cmd], off_env),
        "gpuhpc submit, ledger on": ([*gpuhpc, "submit", *opts, "--account", "research", *cmd], on_env),
        "python -c pass (floor)": ([sys.executable, "-c", "print('-')"], env),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    job_ids: list[str] = []
    try:
        for argv, venv in variants.values():         # one warm-up each (page cache)
            job_ids.append(_timed(argv, venv)[1])
        for _ in range(args.n):                      # interleaved: same load for all
            for name, (argv, venv) in variants.items():
                dt, job_id = _timed(argv, venv)
                times[name].append(dt)
                job_ids.append(job_id)
    finally:
        job_ids = [j for j in job_ids if j.isdigit()]
        for i in range(0, len(job_ids), 100):
            subprocess.run(["scancel", *job_ids[i:i + 100]], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["sbatch"]
    print(f"submit latency over {args.n} submissions each, a new process each (partition {args.partition}, "
          f"held, cancelled; GPUHPC_CMDSERVER=off; {' '.join(gpuhpc)})")
    print(f"{'variant':<28} {'median ms':>10} {'mean ms':>10} {'/ sbatch':>9}")
    for name, ts in times.items():
        print(f"{name:<28} {med[name] * 1000:>10.1f} {statistics.mean(ts) * 1000:>10.1f} {med[name] / base:>8.2f}x")
    on, off = med["gpuhpc submit, ledger on"], med["gpuhpc submit, ledger off"]
    print(f"ledger on / ledger off (median): {on / off:.2f}x (goal <= 2x); the SQLite quota check adds "
          f"{(on - off) * 1000:.1f} ms")
    print(f"pure-Python gpuhpc submit / sbatch (median, informational): {off / base:.2f}x ledger off, "
          f"{on / base:.2f}x ledger on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
