"""The ledger's health for Prometheus, through node_exporter's textfile collector (issue 34 point 4).

The ledger's commands run from cron, not as daemons, so each one that succeeds writes its own
small file in the Prometheus text format (``--textfile PATH``; node_exporter reads every
``*.prom`` of its ``--collector.textfile.directory``, Debian's ``/var/lib/prometheus/node-exporter``):

* ``gpuhpc ledger ingest``: ``gpuhpc_ledger_ingest_success_timestamp_seconds``;
* ``gpuhpc ledger sync-slurm``: ``gpuhpc_ledger_sync_success_timestamp_seconds``;
* ``gpuhpc ledger check``: ``gpuhpc_ledger_drift{kind}`` and ``gpuhpc_ledger_check_timestamp_seconds``
  (:func:`gpuhpc.ledger.check.textfile`) and ``gpuhpc_ledger_drift_associations``: how many
  associations' limits or usage differ from the ledger's;
* ``gpuhpc ledger rollover``: when it ran, when the plan it read was written, the next planned
  reset, and the resets it made and failed to make;
* ``gpuhpc ledger alerts``: when it last ran through, and the budget alerts it sent and could not
  send (written also when some could not be sent, so the failures show).

A command that fails writes nothing, so its timestamp ages: the rules
(``gpuhpc/monitoring/prometheus/rules.yml``) record the age (``gpuhpc:ledger_ingest_age_seconds``,
``gpuhpc:ledger_sync_age_seconds``) and alert on it (``LedgerIngestStale``, ``LedgerSyncStale``,
``LedgerAlertsStale``), on drift (``LedgerSlurmDrift``) and on budget alerts that do not reach their
contact (``LedgerAlertsUndelivered``). A database outage then says so well before a period ends.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

Sample = tuple[str, str, dict[str, str], float]        # name, help, labels, value


def render(samples: list[Sample]) -> str:
    """Prometheus text format: one HELP and TYPE (gauge) per name, then its samples."""
    lines: list[str] = []
    seen: set[str] = set()
    for name, help_, labels, value in samples:
        if name not in seen:
            seen.add(name)
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        lab = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{lab}}} {_num(value)}" if lab else f"{name} {_num(value)}")
    return "\n".join(lines) + "\n"


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def write(path: Path | str, text: str) -> None:
    """Atomically (node_exporter never reads half a file), readable by node_exporter (0644)."""
    from gpuhpc.fsutil import write_atomic

    write_atomic(path, text, mode=0o644)


def _ts(at: dt.datetime | None) -> float:
    return (at or dt.datetime.now(dt.timezone.utc)).timestamp()


def ingest(at: dt.datetime | None = None) -> str:
    return render([("gpuhpc_ledger_ingest_success_timestamp_seconds",
                    "When gpuhpc ledger ingest last settled Slurm's usage into the ledger.", {}, int(_ts(at)))])


def sync(at: dt.datetime | None = None) -> str:
    return render([("gpuhpc_ledger_sync_success_timestamp_seconds",
                    "When gpuhpc ledger sync-slurm last put the ledger's budgets in Slurm and wrote the reset plan.",
                    {}, int(_ts(at)))])


def drift_associations(res) -> int:
    """Associations (an account's, or a user's in an account) whose limits or usage in Slurm differ
    from the ledger's (a :class:`gpuhpc.ledger.check.CheckResult`): each counted once, whatever
    differs."""
    return len({d.what for d in res.differences if d.kind in ("limits", "usage", "reset")})


def check(res, at: dt.datetime | None = None) -> str:
    from gpuhpc.ledger import check as check_mod

    return check_mod.textfile(res, at) + render([
        ("gpuhpc_ledger_drift_associations", "Associations whose limits or usage in Slurm differ from the ledger's "
         "(the last gpuhpc ledger check; 0: in step).", {}, drift_associations(res))])


def rollover(res, at: dt.datetime | None = None) -> str:
    """A :class:`gpuhpc.ledger.rollover.RolloverResult`'s figures."""
    return render([
        ("gpuhpc_ledger_rollover_timestamp_seconds", "When gpuhpc ledger rollover last ran.", {}, int(_ts(at))),
        ("gpuhpc_ledger_rollover_plan_timestamp_seconds", "When sync-slurm wrote the reset plan the rollover read "
         "(0: no plan).", {}, res.plan_generated or 0),
        ("gpuhpc_ledger_rollover_next_reset_timestamp_seconds", "The earliest period start the plan still has to "
         "reset (0: none).", {}, res.next_reset or 0),
        ("gpuhpc_ledger_rollover_resets", "Associations whose usage the last rollover reset.", {}, len(res.applied)),
        ("gpuhpc_ledger_rollover_failures", "Resets the last rollover could not make (tried again next run).", {},
         len(res.failed)),
    ])


def alerts(rows, at: dt.datetime | None = None) -> str:
    """A ``gpuhpc ledger alerts`` run's figures (``rows``: its :class:`gpuhpc.ledger.alerts.Alert`
    list): when it ran, and how many alerts it sent and could not send."""
    return render([
        ("gpuhpc_ledger_alerts_timestamp_seconds", "When gpuhpc ledger alerts last ran through.", {}, int(_ts(at))),
        ("gpuhpc_ledger_alerts_sent", "Budget alerts the last gpuhpc ledger alerts sent.", {},
         sum(1 for a in rows if a.status == "sent")),
        ("gpuhpc_ledger_alerts_failed", "Budget alerts the last gpuhpc ledger alerts could not send (tried again "
         "next run).", {}, sum(1 for a in rows if a.status == "failed")),
    ])
