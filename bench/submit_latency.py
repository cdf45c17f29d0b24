#!/usr/bin/env python3
"""Submit latency: ``gpuhpc submit`` (a fresh process each time: CLI cold start, parsing,
rendering, quota hook, sbatch) against raw ``sbatch`` of the same rendered script.

    python bench/submit_latency.py [-n 50] [--partition cpu]

``gpuhpc`` is measured the way ``scripts/bootstrap.sh`` installs it: the compiled client
(gpuhpc/cmdserver/client.c, built here into a temporary directory) with its command server
(a private one, under a temporary GPUHPC_RUNTIME_DIR). Also measured: the pure-Python CLI
(``python -P -m gpuhpc``, what ``GPUHPC_CMDSERVER=off`` runs), the interpreter's own
start-up (``python -c``, the floor any CPython CLI pays), and the first command after the
server is stopped (it runs the Python CLI and starts a server in the background).

Jobs are submitted held (``--hold``) to a CPU partition and cancelled by id at the end.
Prints the median and mean wall time of each and their ratio to sbatch (goal: <= 1.5x),
with the ledger off and with a SQLite ledger enforcing a quota.
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
        raise SystemExit(f"{argv[0]} failed: {res.stderr.strip()}")
    return dt, res.stdout.strip().splitlines()[-1].split(";")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=50, help="submissions per variant (default 50)")
    ap.add_argument("--partition", default="cpu")
    args = ap.parse_args()

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, pkg)
    from gpuhpc.cmdserver import build, server, socket_path

    tmp = tempfile.mkdtemp(prefix="gpuhpc-bench-")
    gpuhpc = build.build(os.path.join(tmp, "gpuhpc"))
    pygpuhpc = [sys.executable, "-P", "-m", "gpuhpc"]
    env = dict(os.environ, GPUHPC_LOG_DIR=tmp, GPUHPC_RUNTIME_DIR=os.path.join(tmp, "run"))
    env.pop("GPUHPC_CMDSERVER", None)
    sock = socket_path(env)
    # measure what a user gets: bytecode cached (some sandboxes export PYTHONDONTWRITEBYTECODE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(pkg, "gpuhpc")], env=env, check=False)
    opts = ["--partition", args.partition, "--time", "15m", "--hold", "--name", "gpuhpc-bench"]
    cmd = ["--", "true"]
    # the very script gpuhpc submits, for raw sbatch
    script = os.path.join(tmp, "job.sbatch")
    dry = subprocess.run([*pygpuhpc, "submit", *opts, "--dry-run", *cmd], capture_output=True, text=True, env=env)
    if dry.returncode != 0:
        raise SystemExit(f"gpuhpc submit --dry-run failed: {dry.stderr.strip()}")
    with open(script, "w") as fh:
        fh.write(dry.stdout)

    # the ledger in use: a fresh SQLite ledger with a price and a quota on the account
    ledger_env = dict(env, GPUHPC_DATA_DIR=os.path.join(tmp, "ledger"))
    env["GPUHPC_LEDGER"] = "off"
    for admin in (["db", "upgrade"], ["ledger", "price", "set", "--gpu-type", "*", "--rate", "1"],
                  ["ledger", "account", "add", "research"], ["quota", "set", "research", "--gpu-hours", "1000000"]):
        subprocess.run([*pygpuhpc, *admin], env=ledger_env, capture_output=True, check=True)
    server.start(sock, idle=600)

    # two phases, each interleaving its variants with raw sbatch (same load for all) and
    # compared with its own sbatch baseline; the 100 ms pure-Python runs are kept out of the
    # first phase, where they would only evict the server's warm caches between submissions
    phases = [
        {"sbatch": (["sbatch", "--parsable", script], env),
         "gpuhpc submit": ([gpuhpc, "submit", *opts, *cmd], env),
         "gpuhpc submit + SQLite quota": ([gpuhpc, "submit", *opts, "--account", "research", *cmd], ledger_env)},
        {"sbatch (phase 2)": (["sbatch", "--parsable", script], env),
         "python CLI submit": ([*pygpuhpc, "submit", *opts, *cmd], env),
         "python CLI + SQLite quota": ([*pygpuhpc, "submit", *opts, "--account", "research", *cmd], ledger_env),
         "python -c pass (floor)": ([sys.executable, "-c", "print('-')"], env)},
    ]
    times: dict[str, list[float]] = {k: [] for phase in phases for k in phase}
    job_ids: list[str] = []
    try:
        for variants in phases:
            for name, (argv, venv) in variants.items():    # one warm-up each (page cache)
                job_ids.append(_timed(argv, venv)[1])
            for _ in range(args.n):                          # interleaved: same load for all
                for name, (argv, venv) in variants.items():
                    dt, job_id = _timed(argv, venv)
                    times[name].append(dt)
                    job_ids.append(job_id)
        first = []                                       # a cold server: stop it first
        for _ in range(3):
            server.stop(sock)
            dt, job_id = _timed([gpuhpc, "submit", *opts, *cmd], env)
            first.append(dt)
            job_ids.append(job_id)
            server.start(sock, idle=600)
    finally:
        server.stop(sock)
        job_ids = [j for j in job_ids if j.isdigit()]
        for i in range(0, len(job_ids), 100):
            subprocess.run(["scancel", *job_ids[i:i + 100]], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    base = statistics.median(times["sbatch"])
    base2 = statistics.median(times["sbatch (phase 2)"])
    times["first call, server stopped"] = first
    print(f"submit latency over {args.n} submissions each (partition {args.partition}, held, cancelled)")
    print(f"{'variant':<30} {'median ms':>10} {'mean ms':>10} {'ratio':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        ref = base2 if name in phases[1] else base
        print(f"{name:<30} {med * 1000:>10.1f} {statistics.mean(ts) * 1000:>10.1f} {med / ref:>6.2f}x")
    ratio = statistics.median(times["gpuhpc submit"]) / base
    print(f"ratio gpuhpc submit / sbatch (median): {ratio:.2f}x (goal <= 1.5x; ledger off)")
    ratio = statistics.median(times["gpuhpc submit + SQLite quota"]) / base
    print(f"ratio gpuhpc submit with the SQLite quota check / sbatch (median): {ratio:.2f}x")
    ratio = statistics.median(times["python CLI submit"]) / base2
    print(f"ratio without the command server (GPUHPC_CMDSERVER=off) / sbatch (median): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
