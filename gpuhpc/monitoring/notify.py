"""The waste notifier: turns firing ``GpuhpcIdleGpuHeld`` alerts (``prometheus/rules.yml``) into
one JSON line in a log file and/or one JSON POST to a webhook per alert, once.

No Alertmanager needed: it reads Prometheus' own ``/api/v1/alerts``. Run it every minute from
cron or a timer (``python -m gpuhpc.monitoring.notify --log /var/log/gpuhpc/waste.log``); a
state file remembers what was already sent (an alert is identified by its labels and the time
it became active, so a GPU that goes idle again later is reported again).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request

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


def alerts(prom_url: str, timeout: float = 20) -> list[dict]:
    try:
        with urllib.request.urlopen(f"{prom_url.rstrip('/')}/api/v1/alerts", timeout=timeout) as resp:
            body = json.load(resp)
    except (OSError, ValueError) as exc:
        raise GpuhpcError(f"cannot read alerts from Prometheus at {prom_url}: {exc}") from None
    return body.get("data", {}).get("alerts", [])


def notify(records: list[dict], *, state_file: str, log: str | None = None, webhook: str | None = None) -> list[dict]:
    """Send the records not sent before; returns what was sent."""
    from gpuhpc.fsutil import write_atomic

    try:
        with open(state_file, encoding="utf-8") as fh:
            sent = set(json.load(fh))
    except (OSError, ValueError):
        sent = set()
    new = [r for r in records if key(r) not in sent]
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
    ap.add_argument("--prometheus", default=os.environ.get("GPUHPC_PROMETHEUS_URL", "http://127.0.0.1:9090"))
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
                      webhook=args.webhook)
    except GpuhpcError as exc:
        sys.stderr.write(f"error: {exc.one_line()}\n")
        return 1
    sys.stderr.write(f"{len(sent)} new idle-GPU alert(s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
