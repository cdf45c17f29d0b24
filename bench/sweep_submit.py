#!/usr/bin/env python3
"""Submitting a 1,000-trial sweep (goal: ``gpuhpc sweep run`` / raw sbatch of the same chunks
<= 1.5x; the Python API / submitit ``map_array`` of 1,000 calls <= 0.5x).

    python bench/sweep_submit.py [-r 3] [--trials 1000] [--chunk 51] [--partition cpu]

Variants, interleaved so that all see the same load, each a fresh process, every job held
(``--hold``) and cancelled by id at the end:

* ``sbatch`` of the very chunk scripts ``gpuhpc sweep run`` submits (``--array=0-50%16``,
  ``--array=0-50%16`` ... rendered once, before timing): the baseline;
* for the floor: a fresh interpreter importing what sweep run imports (added to the sbatch
  calls, which sweep run also makes one after the other);
* ``gpuhpc sweep run FILE --json``, up to its return, when every chunk is queued (a fresh data
  dir each time, its database already migrated: the steady state, ledger on, no quota);
* the Python API: ``gpuhpc.sweep(fn, space, trials=1000, hold=True)`` in a fresh interpreter
  (imports included), against submitit's ``executor.map_array(fn, range(1000))`` (held).

``--chunk`` is the array size (51: the CI cluster's MaxArraySize); the API variants use the
cluster's own MaxArraySize. submitit does not split: one ``map_array`` of 1,000 calls fails on a
cluster with a smaller MaxArraySize (submitit#1624), so its baseline is one ``map_array`` per chunk. Prints the median wall time per variant
and the two ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

API_CODE = r"""
import sys, time, json
t0 = time.perf_counter()
kind, n, part, folder, chunk = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def objective(x):
    return float(x * x)
if kind == "gpuhpc":
    import gpuhpc
    sw = gpuhpc.sweep(objective, {"x": {"type": "int", "low": 0, "high": n - 1}}, method="grid",
                      resources={"partition": part, "time": "5m"}, metric="loss", hold=True, parallelism=n)
    dt = time.perf_counter() - t0                  # returned: every chunk is queued
    ids = [c["job_id"] for c in sw.info()["chunks"]]
else:
    import submitit
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(slurm_partition=part, timeout_min=5, slurm_array_parallelism=16,
                         slurm_additional_parameters={"hold": True})
    # map_array makes one array of n tasks: past MaxArraySize sbatch refuses it (submitit#1624),
    # so the baseline is map_array per chunk of at most MaxArraySize calls
    jobs = []
    for i in range(0, n, chunk):
        jobs += ex.map_array(objective, range(i, min(n, i + chunk)))
    dt = time.perf_counter() - t0
    ids = sorted({j.job_id.split("_")[0] for j in jobs})
print(json.dumps({"seconds": dt, "ids": ids}))
"""


def _run(argv: list[str], env: dict[str, str], input: str | None = None) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, env=env, input=input)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {res.stderr.strip()}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-r", "--repeats", type=int, default=1,
                    help="each repeat leaves 5 x TRIALS cancelled job records in slurmctld until MinJobAge")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=51, help="array size of the CLI sweep (default 51)")
    ap.add_argument("--partition", default="cpu")
    ap.add_argument("--no-api", action="store_true", help="skip the Python API vs submitit part")
    ap.add_argument("--no-cli", action="store_true", help="skip the sweep run vs sbatch part")
    args = ap.parse_args()

    import yaml

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="gpuhpc-bench-sweep-")
    env = dict(os.environ, GPUHPC_CMDSERVER="off")
    env["PYTHONPATH"] = os.pathsep.join([pkg, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("GPUHPC_DB_URL", None)
    env.pop("GPUHPC_LEDGER", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(pkg, "gpuhpc")], env=env, check=False)
    script_bin = os.path.join(os.path.dirname(sys.executable), "gpuhpc")
    gpuhpc = [script_bin] if os.access(script_bin, os.X_OK) else [sys.executable, "-m", "gpuhpc"]

    sweep_file = os.path.join(tmp, "sweep.yaml")
    with open(sweep_file, "w") as fh:
        yaml.safe_dump({"name": "bench-sweep", "command": "echo {x}", "method": "grid",
                        "parameters": {"x": {"type": "int", "low": 0, "high": args.trials - 1}},
                        "parallelism": args.trials, "resources": {"partition": args.partition, "time": "5m"},
                        "metric": {"name": "loss"}, "chunk_size": args.chunk, "hold": True}, fh)

    # the baseline's scripts: exactly what gpuhpc sweep run renders for its chunks
    sys.path.insert(0, pkg)
    from gpuhpc.jobs.render import render
    from gpuhpc.sweeps.planner import trial_spec
    from gpuhpc.sweeps.spec import load_file

    spec = load_file(sweep_file)
    sizes = [min(args.chunk, args.trials - i) for i in range(0, args.trials, args.chunk)]
    scripts = [render(trial_spec(spec, 0, __import__("pathlib").Path(tmp) / "raw", n, k, k))
               for n, k in enumerate(sizes)]

    # every held task cancelled at the end stays a job record until MinJobAge: make sure this
    # run cannot fill MaxJobCount (which would refuse everyone's jobs meanwhile)
    from gpuhpc.slurm.client import SlurmClient

    sc = SlurmClient()
    lim = sc.submit_limits()
    limit, max_array = lim.max_job_count, lim.max_array_size
    held = sc.job_records()
    need = args.repeats * args.trials * ((0 if args.no_cli else 2) + (0 if args.no_api else 2))
    if held + need > limit * 0.8:
        raise SystemExit(f"not running: slurmctld holds {held} job records, this run adds {need}, MaxJobCount is "
                         f"{limit}; wait for MinJobAge to expire records, or lower --repeats/--trials")
    cancel: list[str] = []
    times: dict[str, list[float]] = {"sbatch": [], "python + imports": [], "sweep run": [],
                                     "gpuhpc.sweep": [], "submitit map_array": []}
    try:
        for rep in range(args.repeats):
            if not args.no_cli:
                # raw sbatch of the same chunks, one process each (what a shell loop does)
                t0 = time.perf_counter()
                for s in scripts:
                    cancel.append(_run(["sbatch", "--parsable"], env, input=s).stdout.strip().split(";")[0])
                times["sbatch"].append(time.perf_counter() - t0)
                # and of gpuhpc's start: the interpreter and the modules sweep run imports
                t0 = time.perf_counter()
                _run([sys.executable, "-c", "import gpuhpc.cli.sweep, gpuhpc.sweeps.submission, gpuhpc.sweeps.spec, "
                                            "gpuhpc.jobs.api, gpuhpc.ledger.quota, yaml"], env)
                times["python + imports"].append(time.perf_counter() - t0)
                denv = dict(env, GPUHPC_DATA_DIR=os.path.join(tmp, f"cli{rep}"))
                _run([*gpuhpc, "db", "upgrade"], denv)
                t0 = time.perf_counter()
                sid = json.loads(_run([*gpuhpc, "sweep", "run", sweep_file, "--json"], denv).stdout)["sweep_id"]
                times["sweep run"].append(time.perf_counter() - t0)
                st = json.loads(_run([*gpuhpc, "sweep", "status", str(sid), "--json"], denv).stdout)
                assert len(st["chunks"]) == len(sizes) and all(c["job_id"] for c in st["chunks"]), st
                cancel += [c["job_id"] for c in st["chunks"]]

            if args.no_api:
                continue
            for kind, label in (("gpuhpc", "gpuhpc.sweep"), ("submitit", "submitit map_array")):
                data = os.path.join(tmp, f"api-{kind}{rep}")
                denv = dict(env, GPUHPC_DATA_DIR=data)
                _run([*gpuhpc, "db", "upgrade"], denv)
                t0 = time.perf_counter()
                out = json.loads(_run([sys.executable, "-c", API_CODE, kind, str(args.trials), args.partition,
                                       os.path.join(data, "submitit"), str(max_array)], denv).stdout)
                times[label].append(out["seconds"])        # in the interpreter, imports included
                cancel += out["ids"]
    finally:
        for i in range(0, len(cancel), 50):
            subprocess.run(["scancel", *cancel[i:i + 50]], capture_output=True)

    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"{args.trials} trials in {len(sizes)} chunks of <= {args.chunk} (held, {args.repeats} repeats, median)")
    for k, v in med.items():
        print(f"  {k:<20} {v * 1000:8.0f} ms")
    if "sweep run" in med:
        ratio = med["sweep run"] / med["sbatch"]
        print(f"gpuhpc sweep run / raw sbatch of the same chunks: {ratio:.2f}x (goal <= 1.5x)")
        floor = (med["sbatch"] + med["python + imports"]) / med["sbatch"]
        print(f"  its floor, sbatch + python with sweep run's imports / raw sbatch: {floor:.2f}x")
    if "gpuhpc.sweep" in med:
        r2 = med["gpuhpc.sweep"] / med["submitit map_array"]
        print(f"gpuhpc.sweep / submitit map_array of {args.trials} calls: {r2:.2f}x (goal <= 0.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
