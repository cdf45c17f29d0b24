"""Webhooks for a job's ``notify:`` (end, failure, requeue cap), sent from outside the job.

A job's own script cannot be trusted to send them: Slurm kills it at the time limit, at
``scancel`` and with its node, and compute nodes often cannot reach the outside. So (as the
waste notifier, :mod:`gpuhpc.monitoring.notify`, does for idle GPUs) the sender is a one-shot
that runs where jobs are submitted, every minute from cron or a timer, as the user:

    python -m gpuhpc.jobs.notify            # or --every 60 to keep running

At submission :func:`register` writes ``<data dir>/notify/<job id>.json`` (0600: a webhook URL
often holds a token): the events and URLs. Each run asks slurmctld (``scontrol show job``), else
slurmdbd (``sacct``), how each registered job stands; once it has ended (a requeueable job that
was preempted or lost its node is not ended: it comes back) it POSTs one JSON record per URL
for the most specific event asked for that applies (``requeue_cap`` before ``fail`` before
``end``) and removes the registration; a URL that failed is tried again at the next run. The
URL is user text: checked when the job was made (http/https, :func:`gpuhpc.jobs.spec.check_webhook`),
then only passed to urllib (no shell, no redirects followed). Mail needs none of this: Slurm
sends it (``--mail-type``/``--mail-user``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpuhpc.errors import GpuhpcError
from gpuhpc.jobs.spec import NOTIFY_EVENTS, check_webhook
from gpuhpc.slurm.state import JobState, SlurmState

log = logging.getLogger(__name__)

#: the template's exit code when it stops requeueing a job (job-templates/_base.sbatch.j2)
REQUEUE_CAP_EXIT = "75"
#: a registration whose job no Slurm daemon knows after this long is dropped
FORGET_AFTER_S = 7 * 24 * 3600


def notify_dir(runner: Any = None) -> str:
    """``<gpuhpc data dir>/notify`` here; over SSH, the cluster's default data dir
    (``~/.local/share/gpuhpc/notify`` in the remote home), where the notifier runs there."""
    if runner is None or runner.is_local:
        from gpuhpc.fsutil import data_dir

        return str(data_dir() / "notify")
    return f"{runner.home().rstrip('/')}/.local/share/gpuhpc/notify"


def register(job_id: str, name: str, notify: Any, runner: Any = None) -> str | None:
    """Write the registration of ``job_id``'s webhooks (None when ``notify`` has none); returns its path."""
    if notify is None or not notify.webhooks:
        return None
    directory = notify_dir(runner)
    rec = {"job_id": str(job_id), "name": name, "events": list(notify.events), "webhooks": list(notify.webhooks),
           "sent": [], "registered_at": int(time.time())}
    path = f"{directory}/{job_id}.json"
    text = json.dumps(rec, sort_keys=True)
    if runner is None or runner.is_local:
        from gpuhpc.fsutil import write_atomic

        os.makedirs(directory, 0o700, exist_ok=True)
        write_atomic(path, text, 0o600)
    else:
        runner.makedirs(directory)
        runner.write_file(path, text, 0o600)
    return path


def outcome(client: Any, job_id: str) -> dict[str, Any] | None:
    """How ``job_id`` ended: ``{state, exit_code, restarts, user}``; None while it has not
    (pending, running, requeued, or a preemption / node failure it comes back from) or when no
    Slurm daemon knows it."""
    rec = client.show_job(job_id)
    if rec:
        st = SlurmState.parse(rec.get("JobState", ""))
        ended = st.state.is_finished or (st.state in (JobState.PREEMPTED, JobState.NODE_FAIL)
                                         and rec.get("Requeue") == "0")
        if not ended:
            return None
        restarts = rec.get("Restarts", "0")
        return {"state": st.raw or st.state.value, "exit_code": rec.get("ExitCode", ""),
                "restarts": int(restarts) if restarts.isdigit() else 0,
                "user": (rec.get("UserId") or "").split("(", 1)[0]}
    rows = [a for a in client.accounting(job_ids=[job_id]) if a.job_id == job_id]
    if not rows:
        return None
    a = rows[-1]
    if not (a.state.state.is_finished or a.state.state in (JobState.PREEMPTED, JobState.NODE_FAIL)):
        return None             # slurmctld forgot it only after it ended: a live row is stale
    return {"state": a.state.raw or a.state.state.value, "exit_code": a.exit_code,
            "restarts": client.restarts(job_id), "user": a.user}


def event_for(result: dict[str, Any], wanted: Any) -> str | None:
    """The most specific of ``wanted`` (events) that ``result`` is: requeue_cap, fail, end."""
    state = str(result.get("state", "")).split()[0] if result.get("state") else ""
    cap = state == JobState.FAILED.value and str(result.get("exit_code", "")).split(":")[0] == REQUEUE_CAP_EXIT
    failed = state != JobState.COMPLETED.value
    for ev, applies in (("requeue_cap", cap), ("fail", failed), ("end", True)):
        if applies and ev in wanted:
            return ev
    return None


def message(reg: dict[str, Any], result: dict[str, Any], event: str) -> str:
    what = {"requeue_cap": "stopped being requeued (requeue cap reached)", "fail": "failed", "end": "ended"}[event]
    return (f"job {reg['job_id']} ({reg.get('name') or '?'}) {what}: {result['state']}, exit code "
            f"{result.get('exit_code') or '?'}, {result.get('restarts', 0)} restart(s)")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ARG002
        return None             # a 3xx is an answer, not a new place to send the job's record


def post(url: str, record: dict[str, Any], timeout: float = 10) -> None:
    """POST ``record`` as JSON to ``url`` (checked again: the registration file is data);
    GpuhpcError unless the answer is 2xx."""
    check_webhook(url, "webhook")
    req = urllib.request.Request(url, data=json.dumps(record, sort_keys=True).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpuhpc-notify"})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=timeout) as resp:
            code = resp.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (OSError, ValueError) as exc:
        raise GpuhpcError(f"webhook {url}: {exc}") from None
    if not 200 <= code < 300:
        raise GpuhpcError(f"webhook {url}: HTTP {code}")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        reg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("skipping %s: %s", path, exc)
        return None
    if not isinstance(reg, dict) or not str(reg.get("job_id", "")).replace("_", "").isdigit():
        log.warning("skipping %s: not a registration", path)
        return None
    return reg


def run_once(directory: str | None = None, *, client: Any = None, timeout: float = 10,
             now: float | None = None) -> list[dict[str, Any]]:
    """One pass over the registrations: the records sent (``url`` added to each)."""
    from gpuhpc.fsutil import write_atomic

    root = Path(directory or notify_dir())
    paths = sorted(root.glob("*.json")) if root.is_dir() else []
    if not paths:
        return []
    if client is None:
        from gpuhpc.slurm.client import SlurmClient

        client = SlurmClient()
    now = time.time() if now is None else now
    sent: list[dict[str, Any]] = []
    errors: list[str] = []
    for path in paths:
        reg = _load(path)
        if reg is None:
            continue
        job_id = str(reg["job_id"])
        result = outcome(client, job_id)
        if result is None:
            if now - float(reg.get("registered_at") or now) > FORGET_AFTER_S and not client.show_job(job_id):
                path.unlink(missing_ok=True)
            continue
        event = event_for(result, [e for e in reg.get("events") or NOTIFY_EVENTS if e in NOTIFY_EVENTS])
        if event is None:                       # ended, but not in a way that was asked about
            path.unlink(missing_ok=True)
            continue
        record = {"event": event, "job_id": job_id, "name": reg.get("name"), **result,
                  "message": message(reg, result, event),
                  "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        done = list(reg.get("sent") or [])
        for url in reg.get("webhooks") or []:
            if url in done:
                continue
            try:
                post(url, record, timeout)
            except GpuhpcError as exc:
                errors.append(exc.one_line())
                continue
            done.append(url)
            sent.append({**record, "url": url})
        if all(u in done for u in reg.get("webhooks") or []):
            path.unlink(missing_ok=True)
        else:
            write_atomic(path, json.dumps({**reg, "sent": done}, sort_keys=True), 0o600)
    for e in errors:
        log.warning("%s (tried again at the next run)", e)
    return sent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuhpc.jobs.notify", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="the registrations (default: <gpuhpc data dir>/notify)")
    ap.add_argument("--every", type=float, metavar="SECONDS", help="keep running, one pass this often")
    ap.add_argument("--timeout", type=float, default=10, help="seconds per webhook POST")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    while True:
        try:
            sent = run_once(args.dir, timeout=args.timeout)
        except GpuhpcError as exc:
            sys.stderr.write(f"error: {exc.one_line()}\n")
            if not args.every:
                return 1
            sent = []
        for rec in sent:
            sys.stderr.write(f"sent {rec['event']} of job {rec['job_id']} to {rec['url']}\n")
        if not args.every:
            return 0
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
