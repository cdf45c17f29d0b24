"""The waste notifier: turns firing ``GpuhpcIdleGpuHeld`` alerts (``prometheus/rules.yml``) into
one JSON line in a log file and/or one JSON POST to a webhook per alert, once. Each record has a
``message`` in words naming the job, its user, the GPU and the idle cost so far at the ledger's
price (the job's GPU type, partition and QOS from ``sacct``)::

    job 1044 (alice) holds idle GPU 3 on gpu-node1 (h100) for 11 min: 0.46 so far at 2.50/GPU-hour

No Alertmanager needed: it reads Prometheus' own ``/api/v1/alerts``. Run it every minute from
cron or a timer (``python -m gpuhpc.monitoring.notify --log /var/log/gpuhpc/waste.log``; the
monitoring role installs that cron entry on the Prometheus host); it is a one-shot, not a daemon; a
state file remembers what was already sent (an alert is identified by its labels and the time
it became active, so a GPU that goes idle again later is reported again).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import urllib.request
from decimal import Decimal

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError

ALERT = "GpuhpcIdleGpuHeld"
DEFAULT_STATE = "/var/lib/gpuhpc/waste-notified.json"


def select(alerts: list[dict], *, name: str = ALERT, states: tuple[str, ...] = ("firing",)) -> list[dict]:
    """The alerts named ``name`` in one of ``states``, as flat records."""
    out = []
    for a in alerts:
        labels = a.get("labels", {})
        if labels.get("alertname") != name or a.get("state") not in states:
            continue
        out.append({"alert": name, "state": a.get("state"), "active_at": a.get("activeAt"),
                    "job_id": labels.get("job_id", ""), "user": labels.get("user", ""),
                    "node": labels.get("node", ""), "gpu": labels.get("gpu", ""), "mig": labels.get("mig", ""),
                    "value": a.get("value"), "summary": a.get("annotations", {}).get("summary", "")})
    return out


def key(rec: dict) -> str:
    return "|".join(str(rec.get(k, "")) for k in ("job_id", "node", "gpu", "mig", "active_at"))


def _active_since(text: str | None) -> dt.datetime | None:
    """Prometheus' ``activeAt`` (RFC 3339, nanoseconds, ``Z``) -> aware datetime."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text or "")
    if not m:
        return None
    frac = (m.group(2) or ".0")[:7]
    return dt.datetime.fromisoformat(m.group(1) + frac + ("+00:00" if m.group(3) == "Z" else m.group(3)))


def price(records: list[dict], *, client=None, book=None, now: dt.datetime | None = None) -> list[dict]:
    """Add to each record how long the GPU has been idle, the job's GPU type and rate (the
    ledger's price book: type × partition × QOS at the job's start), the idle cost so far and a
    one-line ``message``. Slurm or the ledger unavailable: the message says "no price"."""
    from gpuhpc.monitoring.efficiency import gpu_rate, price_book, sacct_time

    now = now or dt.datetime.now(dt.timezone.utc)
    jobs = sorted({r["job_id"] for r in records if r.get("job_id", "").isdigit()})
    rows = {}
    if jobs:
        from gpuhpc.slurm.client import SlurmClient

        try:
            for row in (client or SlurmClient()).accounting(job_ids=jobs):
                rows[row.job_id_raw or row.job_id] = row
        except GpuhpcError:
            pass
    book = book if book is not None else (price_book() if rows else None)
    for rec in records:
        since = _active_since(rec.get("active_at"))
        minutes = max(0.0, (now - since).total_seconds() / 60) if since else 0.0
        row = rows.get(rec.get("job_id", ""))
        gtype = next((t for t in row.gpus if t != "gpu"), next(iter(row.gpus), "")) if row else ""
        rate = gpu_rate(book, gtype, row.partition, row.qos, sacct_time(row.start)) if row else None
        cost = (Decimal(str(round(minutes / 60, 6))) * rate).quantize(Decimal("0.01")) if rate is not None else None
        rec.update(idle_minutes=round(minutes, 1), gpu_type=gtype,
                   rate_per_gpu_hour=str(rate) if rate is not None else None,
                   idle_cost=str(cost) if cost is not None else None)
        gpu = rec.get("gpu", "") + (f" ({rec['mig']})" if rec.get("mig") else "")
        money = f"{cost:,.2f} so far at {rate:,.2f}/GPU-hour" if cost is not None else "no price in the ledger"
        rec["message"] = (f"job {rec.get('job_id', '?')} ({rec.get('user') or '?'}) holds idle GPU {gpu} on "
                          f"{rec.get('node', '?')}{f' ({gtype})' if gtype else ''} for {minutes:.0f} min: {money}")
    return records


def alerts(prom_url: str, timeout: float = 20) -> list[dict]:
    try:
        with urllib.request.urlopen(f"{prom_url.rstrip('/')}/api/v1/alerts", timeout=timeout) as resp:
            body = json.load(resp)
    except (OSError, ValueError) as exc:
        raise GpuhpcError(f"cannot read alerts from Prometheus at {prom_url}: {exc}") from None
    return body.get("data", {}).get("alerts", [])


def notify(records: list[dict], *, state_file: str, log: str | None = None, webhook: str | None = None,
           prepare=None) -> list[dict]:
    """Send the records not sent before (``prepare``d first, e.g. :func:`price`); returns what was sent."""
    from gpuhpc.fsutil import write_atomic

    try:
        with open(state_file, encoding="utf-8") as fh:
            sent = set(json.load(fh))
    except (OSError, ValueError):
        sent = set()
    new = [r for r in records if key(r) not in sent]
    if new and prepare is not None:
        new = prepare(new)
    for r in new:
        line = json.dumps(r, sort_keys=True)
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        if webhook:
            req = urllib.request.Request(webhook, data=line.encode(), headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=20).close()
            except OSError as exc:
                raise GpuhpcError(f"webhook {webhook}: {exc}") from None
        sent.add(key(r))
    # forget alerts no longer active, so the state file stays small
    active = {key(r) for r in records}
    os.makedirs(os.path.dirname(os.path.abspath(state_file)), exist_ok=True)
    write_atomic(state_file, json.dumps(sorted(sent & active)))
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuhpc.monitoring.notify", description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", default=getenv("GPUHPC_PROMETHEUS_URL"))
    ap.add_argument("--log", help="append one JSON line per alert")
    ap.add_argument("--webhook", help="POST each alert as JSON")
    ap.add_argument("--state", default=DEFAULT_STATE)
    ap.add_argument("--include-pending", action="store_true", help="also alerts still in their 'for' period")
    args = ap.parse_args(argv)
    if not args.log and not args.webhook:
        sys.stderr.write("error: give --log FILE and/or --webhook URL\n")
        return 2
    states = ("firing", "pending") if args.include_pending else ("firing",)
    try:
        sent = notify(select(alerts(args.prometheus), states=states), state_file=args.state, log=args.log,
                      webhook=args.webhook, prepare=price)
    except GpuhpcError as exc:
        sys.stderr.write(f"error: {exc.one_line()}\n")
        return 1
    sys.stderr.write(f"{len(sent)} new idle-GPU alert(s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
