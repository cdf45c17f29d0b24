"""Worker processes for the ledger reliability tests (run as scripts, one process each).

    python ledger_workers.py reserve URL START_AT ATTEMPTS   -> prints {"ok": n, "refused": m}
    python ledger_workers.py ingest URL N_JOBS BATCH         -> prints "batch K" after each commit
"""
from __future__ import annotations

import datetime as dt
import json
import sys
import time
from decimal import Decimal

BASE = dt.datetime(2026, 11, 2, 8, 0, tzinfo=dt.timezone.utc)


def reserve_main(url: str, start_at: float, attempts: int) -> None:
    from gpuhpc.errors import QuotaExceeded
    from gpuhpc.ledger import db, quota
    from gpuhpc.ledger.hooks import ChargeRequest

    db.check_schema(url)
    req = ChargeRequest(cluster="local", user="alice", account="research", partition=None, qos=None,
                        gpu_type="h100", gpus=3, time_limit_s=3600)
    while time.time() < start_at:
        time.sleep(0.001)
    ok = refused = 0
    ids = []
    for _ in range(attempts):
        try:
            r = quota.reserve(req, url=url)
            ok += 1
            ids.append(r.id)
        except QuotaExceeded:
            refused += 1
    print(json.dumps({"ok": ok, "refused": refused, "ids": ids}), flush=True)


def synthetic_rows(n_jobs: int):
    """Deterministic sacct rows: n_jobs jobs, every 5th requeued once (two runs)."""
    from gpuhpc.slurm.commands import SACCT_RUN_FIELDS as SACCT_FIELDS
    from gpuhpc.slurm.commands import SEP
    from gpuhpc.slurm.parsers import parse_sacct

    def fmt(t: dt.datetime) -> str:
        return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

    lines = []
    for i in range(n_jobs):
        start = BASE + dt.timedelta(seconds=i * 7)
        gpus = 1 + i % 8
        elapsed = 30 + (i * 37) % 3000
        runs = [("PREEMPTED", start, elapsed), ("COMPLETED", start + dt.timedelta(seconds=elapsed + 20), 11 + i % 50)] \
            if i % 5 == 0 else [("COMPLETED", start, elapsed)]
        for state, st, el in runs:
            tres = f"cpu=1,gres/gpu:h100={gpus},gres/gpu={gpus},node=1"
            d = {"JobID": str(10_000 + i), "JobIDRaw": str(10_000 + i), "JobName": "j", "State": state,
                 "Elapsed": "", "ElapsedRaw": str(el), "Submit": fmt(st), "Start": fmt(st),
                 "End": fmt(st + dt.timedelta(seconds=el)), "AllocTRES": tres, "ReqTRES": tres,
                 "Partition": "gpu" if i % 2 else "gpu-hi", "Account": "research", "User": "alice",
                 "QOS": "normal", "Cluster": "local", "Timelimit": "01:00:00"}
            lines.append(SEP.join(d[f] for f in SACCT_FIELDS))
    return parse_sacct("\n".join(lines), fields=SACCT_FIELDS)


def expected_total(n_jobs: int) -> Decimal:
    """What the ledger must hold, computed independently of the ingest code."""
    from fractions import Fraction

    from gpuhpc.ledger.pricing import to_decimal

    total = Decimal(0)
    for i in range(n_jobs):
        gpus = 1 + i % 8
        elapsed = 30 + (i * 37) % 3000
        mult = Fraction(3, 5) if i % 2 else Fraction(1)
        runs = [elapsed, 11 + i % 50] if i % 5 == 0 else [elapsed]
        for el in runs:
            total += to_decimal(Fraction(gpus * el, 3600) * Fraction(5, 2) * mult)
    return total


def ingest_main(url: str, n_jobs: int, batch: int) -> None:
    from gpuhpc.ledger import ingest

    rows = synthetic_rows(n_jobs)
    ingest.ingest_rows(rows, url=url, batch_size=batch,
                       on_batch=lambda r: print(f"batch {r.batches}", flush=True))
    print("done", flush=True)


if __name__ == "__main__":
    cmd, url = sys.argv[1], sys.argv[2]
    if cmd == "reserve":
        reserve_main(url, float(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "ingest":
        ingest_main(url, int(sys.argv[3]), int(sys.argv[4]))
