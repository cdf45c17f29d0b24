#!/usr/bin/env python3
"""Controller load of a sweep (issue 21): slurmctld requests (``sdiag``, by message type) and
slurmdbd requests (``sacctmgr show stats``), read before and after.

    python bench/sweep_rpc.py [--window 60] [--small 100] [--large 2000] [--trials 1000] [--partition all]
    python bench/sweep_rpc.py --quick      # one shorter run for a small shared machine (printed)

1. **Constant in sweep size.** A held sweep (every trial queued, none runs: parallelism = its
   trials) with its driver polling and a ``gpuhpc sweep wait`` running, for ``--window``
   seconds: requests per minute with ``--small`` trials queued, then with ``--large``.
   Goal: large / small <= 1.2.
2. **Total for a sweep.** ``--trials`` trivial trials (``true``) through ``gpuhpc sweep run`` +
   ``gpuhpc sweep wait``, against the same trials through submitit: ``map_array`` (one per
   MaxArraySize chunk: submitit does not split) and ``job.result()`` on each. Goal: <= 0.5x.

Both are printed in one run, first the exact count of the Slurm commands our processes ran
(pass-through wrappers on PATH, which the driver job inherits), then sdiag's and slurmdbd's
request counts. The cluster is shared: other users' requests fall into every window, so each
sdiag figure is the difference before/after less the idle rate measured first, and is printed
as "n/a" when it is within that noise. ``--quick`` runs 40 s windows, 100 vs 1,000 queued and a
200-trial total (the driver polling every 5 s); the first line says what ran. Jobs are
cancelled by id at the end, also on SIGTERM.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

#: slurmctld messages a job's own life sends (slurmd, slurmstepd): they scale with the jobs
#: that run, whoever follows them, and are reported apart from the queries
LIFECYCLE = ("REQUEST_STEP_COMPLETE", "REQUEST_COMPLETE_PROLOG", "REQUEST_COMPLETE_BATCH_SCRIPT",
             "MESSAGE_EPILOG_COMPLETE", "REQUEST_JOB_STEP_CREATE", "REQUEST_NODE_REGISTRATION_STATUS",
             "MESSAGE_NODE_REGISTRATION_STATUS", "REQUEST_BATCH_JOB_LAUNCH", "REQUEST_JOB_READY",
             "REQUEST_STEP_LAYOUT", "REQUEST_JOB_SBCAST_CRED", "REQUEST_HET_JOB_ALLOC_INFO",
             "REQUEST_JOB_ALLOCATION_INFO", "REQUEST_PING", "RESPONSE_PING_SLURMD", "REQUEST_UPDATE_NODE",
             "REQUEST_PERSIST_INIT", "MESSAGE_COMPOSITE", "REQUEST_KILL_TIMELIMIT", "REQUEST_JOB_REQUEUE")
_RPC = re.compile(r"^\s*([A-Z_]+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def _rpcs(text: str) -> dict[str, int]:
    """``NAME ( n) count:N`` lines of the 'by message type' section."""
    part = text.split("by message type", 1)[-1].split("by user", 1)[0]
    return {m.group(1): int(m.group(2)) for m in _RPC.finditer(part)}


def snapshot() -> tuple[dict[str, int], dict[str, int]]:
    ctld = _rpcs(subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout)
    dbd = _rpcs(subprocess.run(["sacctmgr", "show", "stats"], capture_output=True, text=True, check=True).stdout)
    return ctld, dbd


def diff(a, b) -> dict[str, dict[str, int]]:
    out = {}
    for name, before, after in (("slurmctld", a[0], b[0]), ("slurmdbd", a[1], b[1])):
        out[name] = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) - before.get(k, 0) > 0}
    return out


def queries(d: dict[str, dict[str, int]]) -> int:
    """slurmctld queries and commands (not a job's own life messages) + every slurmdbd request."""
    return sum(v for k, v in d["slurmctld"].items() if k not in LIFECYCLE) + sum(d["slurmdbd"].values())


TOOLS = ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo", "sacctmgr", "sdiag")


def counting_wrappers(bin_dir: str) -> str:
    """Pass-through wrappers that log each Slurm command our processes run (the driver job
    inherits PATH): the exact count of what we asked, next to sdiag's shared view."""
    import shutil

    os.makedirs(bin_dir)
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            continue
        path = os.path.join(bin_dir, tool)
        with open(path, "w") as fh:
            fh.write(f'#!/bin/sh\necho {tool} >> "{bin_dir}/calls.log"\nexec {real} "$@"\n')
        os.chmod(path, 0o755)
    return bin_dir


def calls(bin_dir: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(os.path.join(bin_dir, "calls.log")) as fh:
            for line in fh:
                out[line.strip()] = out.get(line.strip(), 0) + 1
    except FileNotFoundError:
        pass
    return out


def minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)}


def _run(argv, env, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, env=env, **kw)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    return res


SUBMITIT = r"""
import json, sys, submitit
n, part, folder, chunk = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
ex.update_parameters(slurm_partition=part, timeout_min=5, slurm_array_parallelism=int(sys.argv[5]),
                     cpus_per_task=1, slurm_mem="500M")
jobs = []
for i in range(0, n, chunk):
    jobs += ex.map_array(int, list(range(i, min(n, i + chunk))))
print(json.dumps({"ids": sorted({j.job_id.split("_")[0] for j in jobs})}), flush=True)
assert [j.result() for j in jobs] == list(range(n))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0, help="seconds per rate window")
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--large", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--parallelism", type=int, default=32)
    ap.add_argument("--partition", default="all")
    ap.add_argument("--poll", default="10", help="the driver's poll (GPUHPC_SWEEP_DRIVER_POLL)")
    ap.add_argument("--quick", action="store_true",
                    help="--window 40 --large 1000 --trials 200 --poll 5: one run that fits a small shared machine")
    args = ap.parse_args()
    if args.quick:
        args.window, args.large, args.trials, args.poll = 40.0, 1000, 200, "5"
    print(f"ran: --window {args.window:g} --small {args.small} --large {args.large} --trials {args.trials} "
          f"--parallelism {args.parallelism} --partition {args.partition} --poll {args.poll}", flush=True)
    sys.stdout.reconfigure(line_buffering=True)       # progress as it comes, even into a file
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # a timeout still cancels our jobs
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="gpuhpc-sweep-rpc-", dir="/var/tmp")
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""), GPUHPC_LEDGER="off",
               GPUHPC_SWEEP_DRIVER_POLL=args.poll, GPUHPC_DATA_DIR=os.path.join(tmp, "data"))
    env.pop("GPUHPC_DB_URL", None)
    wrap = counting_wrappers(os.path.join(tmp, "bin"))
    env["PATH"] = wrap + os.pathsep + env["PATH"]
    gpuhpc = [sys.executable, "-m", "gpuhpc"]
    cancel: list[str] = []
    import yaml

    def sweep(name: str, n: int, hold: bool, parallelism: int, max_queued: int | None = None) -> int:
        f = os.path.join(tmp, f"{name}.yaml")
        with open(f, "w") as fh:
            yaml.safe_dump({"name": name, "command": "true", "method": "grid", "max_queued": max_queued,
                            "parameters": {"x": {"type": "int", "low": 0, "high": n - 1}},
                            "parallelism": parallelism, "hold": hold, "driver_partition": args.partition,
                            "resources": {"partition": args.partition, "time": "5m", "mem": "500M"},
                            "metric": {"name": "loss"}}, fh)
        return json.loads(_run([*gpuhpc, "sweep", "run", f, "--json"], env).stdout)["sweep_id"]

    def jobs_of(sid: int) -> list[str]:
        st = json.loads(_run([*gpuhpc, "sweep", "status", str(sid), "--json"], env).stdout)
        driver = [st["driver_job_id"]] if st["driver_job_id"] else []
        return [c["job_id"] for c in st["chunks"] if c["job_id"]] + driver

    try:
        _run([*gpuhpc, "db", "upgrade"], env)
        a = snapshot()
        time.sleep(args.window)
        idle = queries(diff(a, snapshot())) * 60 / args.window
        print(f"idle (others' requests only): {idle:.0f} requests/min")
        rates: dict[int, float] = {}
        cmd_rates: dict[int, float] = {}
        for n in (args.small, args.large):
            # n trials queued and held, one more array's worth waiting (max_queued): the driver
            # follows them, and a `sweep wait` reads what it writes
            sid = sweep(f"rpc-{n}", n + 51, True, n, max_queued=n)
            cancel += jobs_of(sid)
            waiter = subprocess.Popen([*gpuhpc, "sweep", "wait", str(sid)], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            time.sleep(max(20.0, 2 * float(args.poll)))         # the driver started and settled
            a, c0 = snapshot(), calls(wrap)
            time.sleep(args.window)
            d, ours = diff(a, snapshot()), minus(calls(wrap), c0)
            waiter.kill()
            rates[n] = queries(d) * 60 / args.window
            cmd_rates[n] = sum(ours.values()) * 60 / args.window
            top = sorted(((v, k) for part in d.values() for k, v in part.items() if k not in LIFECYCLE), reverse=True)
            print(f"{n} trials queued: our Slurm commands {cmd_rates[n]:.1f}/min {json.dumps(ours, sort_keys=True)}; "
                  f"sdiag + slurmdbd: {rates[n]:.0f} requests/min ({rates[n] - idle:.0f} over idle; top: "
                  + ", ".join(f"{k} {v}" for v, k in top[:4]) + ")")
            _run([*gpuhpc, "sweep", "cancel", str(sid)], env)
        ratio = cmd_rates[args.large] / max(1e-9, cmd_rates[args.small])
        small, large = rates[args.small] - idle, rates[args.large] - idle
        noise = max(10.0, 0.1 * idle)       # others' requests move by more than this between windows
        sratio = f"{large / small:.2f}x" if small > noise and large > noise else "n/a (within the others' noise)"
        print(f"our Slurm commands/min, {args.large} / {args.small} trials queued: {ratio:.2f}x (goal <= 1.2x); "
              f"slurmctld + slurmdbd requests/min over idle: {sratio}")

        # the total for a sweep: gpuhpc sweep run + wait, then submitit map_array + result()
        totals = {}
        ours = {}
        a, c0 = snapshot(), calls(wrap)
        t0 = time.monotonic()
        sid = sweep("rpc-total", args.trials, False, args.parallelism)
        cancel += jobs_of(sid)
        _run([*gpuhpc, "sweep", "wait", str(sid), "--timeout", "3000"], env)
        gwall = time.monotonic() - t0
        totals["gpuhpc"] = queries(diff(a, snapshot())) - idle * gwall / 60
        ours["gpuhpc"] = minus(calls(wrap), c0)
        max_array = int(re.search(r"MaxArraySize\s*=\s*(\d+)", _run(["scontrol", "show", "config"], env).stdout)[1])
        a, c0 = snapshot(), calls(wrap)
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-c", SUBMITIT, str(args.trials), args.partition,
                              os.path.join(tmp, "submitit"), str(max_array), str(args.parallelism)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        cancel += json.loads(first)["ids"] if first.strip() else []
        out, err = p.communicate(timeout=3000)
        if p.returncode != 0:
            raise SystemExit(f"submitit failed: {err[-500:]}")
        swall = time.monotonic() - t0
        totals["submitit"] = queries(diff(a, snapshot())) - idle * swall / 60
        ours["submitit"] = minus(calls(wrap), c0)
        for k in ours:
            print(f"  {k}: our Slurm commands {sum(ours[k].values())} {json.dumps(ours[k], sort_keys=True)}")
        print(f"{args.trials} trials, parallelism {args.parallelism}: gpuhpc sweep run + wait {totals['gpuhpc']:.0f} "
              f"requests in {gwall:.0f} s; submitit map_array + result() {totals['submitit']:.0f} in {swall:.0f} s "
              f"(others' idle rate subtracted)")
        mine, theirs = sum(ours["gpuhpc"].values()), sum(ours["submitit"].values())
        sb = ours["gpuhpc"].get("sbatch", 0)
        total_ratio = (f"{totals['gpuhpc'] / totals['submitit']:.2f}x" if min(totals.values()) > noise
                       else "n/a (within the others' noise)")
        print(f"gpuhpc / submitit, our Slurm commands: {mine / max(1, theirs):.2f}x (goal <= 0.5x; gpuhpc's floor "
              f"is its {sb} sbatch = {sb / max(1, theirs):.2f}x); slurmctld + slurmdbd requests over idle: "
              f"{total_ratio}")
        print(f"RATIOS queued {args.large}/{args.small}: {ratio:.2f}x (goal <= 1.2x); total {args.trials} trials "
              f"gpuhpc/submitit: {mine / max(1, theirs):.2f}x (goal <= 0.5x)")
    finally:
        for i in range(0, len(cancel), 50):
            subprocess.run(["scancel", *cancel[i:i + 50]], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
