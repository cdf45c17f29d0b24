#!/usr/bin/env python3
"""Submit latency through the opt-in command server (informational; no goal depends on it).

    python bench/cmdserver_latency.py [-n 30] [--partition cpu]

Each submission is a new process, the variants interleaved so that all see the same load:

* ``sbatch`` of the very script ``gpuhpc submit`` renders: the baseline;
* the compiled client served by a warm server (built into a temporary directory, with a
  private runtime directory and a config that enables the server);
* the same client after ``ulimit -n`` lowers a limit: the server declines (a job would
  inherit the caller's limits) and the caller's process runs the Python CLI;
* the plain Python CLI (``python -P -m gpuhpc``) behind the same ``bash -c 'ulimit ...'``.

Jobs are submitted held and cancelled by id. Prints median and mean wall time per variant and
each ratio to sbatch.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="submissions per variant (default 30)")
    ap.add_argument("--partition", default="cpu")
    args = ap.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from gpuhpc.cmdserver import build, server, socket_path

    tmp = tempfile.mkdtemp(prefix="gpuhpc-bench-cs-")
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as fh:
        fh.write("[cmdserver]\nenabled = true\n")
    env = dict(os.environ, GPUHPC_LOG_DIR=tmp, GPUHPC_LEDGER="off", GPUHPC_RUNTIME_DIR=os.path.join(tmp, "run"),
               GPUHPC_CONFIG=config, GPUHPC_SITE_CONFIG=os.path.join(tmp, "no-site-config.toml"))
    env.pop("GPUHPC_CMDSERVER", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    client = build.build(os.path.join(tmp, "gpuhpc"))
    sock = socket_path(env)
    opts = ["submit", "--partition", args.partition, "--time", "15m", "--hold", "--name", "gpuhpc-bench-cs"]
    dry = subprocess.run([sys.executable, "-P", "-m", "gpuhpc", *opts, "--dry-run", "--", "true"],
                         capture_output=True, text=True, env=env, check=True)
    script = os.path.join(tmp, "job.sbatch")
    with open(script, "w") as fh:
        fh.write(dry.stdout)
    # noautostart: a server started from under the lowered limit would serve that variant instead
    lower = ["env", "GPUHPC_CMDSERVER=noautostart", "bash", "-c", 'ulimit -Sn 1000; exec "$@"', "-"]
    variants = {
        "sbatch": ["sbatch", "--parsable", script],
        "client, served": [client, *opts, "--", "true"],
        "client, declined (ulimit)": [*lower, client, *opts, "--", "true"],
        "python CLI (ulimit)": [*lower, sys.executable, "-P", "-m", "gpuhpc", *opts, "--", "true"],
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    ids: list[str] = []
    server.start(sock, idle=600, env=env)
    try:
        for rnd in range(args.n + 1):                # round 0 warms the page cache
            for name, argv in variants.items():
                t0 = time.perf_counter()
                res = subprocess.run(argv, capture_output=True, text=True, env=env)
                if res.returncode != 0:
                    raise SystemExit(f"{name} failed: {res.stderr.strip()}")
                if rnd:
                    times[name].append(time.perf_counter() - t0)
                ids.append(res.stdout.strip().split(";")[0])
    finally:
        server.stop(sock)
        ids = [i for i in ids if i.isdigit()]
        for i in range(0, len(ids), 100):
            subprocess.run(["scancel", *ids[i:i + 100]], capture_output=True)
        with open(sock[: -len(".sock")] + ".log") as fh:
            log = fh.read()
        shutil.rmtree(tmp, ignore_errors=True)

    base = statistics.median(times["sbatch"])
    print(f"submit latency over {args.n} submissions each (partition {args.partition}, held, cancelled)")
    print(f"{'variant':<28} {'median ms':>10} {'mean ms':>10} {'/ sbatch':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<28} {med * 1000:>10.1f} {statistics.mean(ts) * 1000:>10.1f} {med / base:>8.2f}x")
    starts, declined = log.count("] serving "), log.count("] declined ")
    print(f"server log: {starts} start(s) (more than 1: its code changed during the run), {declined} declined "
          f"requests (expected {args.n + 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
