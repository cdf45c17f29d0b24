"""The ledger's health for Prometheus (issue 34 point 4): what ingest, sync-slurm, check and rollover
write for node_exporter's textfile collector, and the alert rules the monitoring role installs on it
(promtool's rule unit tests). The figures from the real ledger and cluster:
tests/integration/ledger/test_ledger_rollover.py."""
from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path

import jinja2
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuhpc.ledger import check, rollover, textfile
from gpuhpc.monitoring import METRICS

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "ansible" / "roles" / "gpuhpc_monitoring"
AT = dt.datetime(2026, 12, 1, 0, 5, tzinfo=dt.timezone.utc)


def parse(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_each_command_writes_its_success_time_and_figures(tmp_path):
    assert parse(textfile.ingest(AT)) == {("gpuhpc_ledger_ingest_success_timestamp_seconds", ()): AT.timestamp()}
    assert parse(textfile.sync(AT)) == {("gpuhpc_ledger_sync_success_timestamp_seconds", ()): AT.timestamp()}
    res = rollover.RolloverResult(plan_generated=1_700_000_000, next_reset=1_800_000_000)
    e = rollover.Entry("proj", "", "month", 0, ())
    res.applied.append((e, rollover.Reset(1, {})))
    got = parse(textfile.rollover(res, AT))
    assert got == {("gpuhpc_ledger_rollover_timestamp_seconds", ()): AT.timestamp(),
                   ("gpuhpc_ledger_rollover_plan_timestamp_seconds", ()): 1_700_000_000,
                   ("gpuhpc_ledger_rollover_next_reset_timestamp_seconds", ()): 1_800_000_000,
                   ("gpuhpc_ledger_rollover_resets", ()): 1, ("gpuhpc_ledger_rollover_failures", ()): 0}
    path = tmp_path / "ledger-ingest.prom"
    textfile.write(path, textfile.ingest(AT))
    assert oct(path.stat().st_mode & 0o777) == "0o644" and path.read_text() == textfile.ingest(AT)
    # every name is in the catalogue the rules are checked against
    names = {n for text in (textfile.ingest(AT), textfile.sync(AT), textfile.rollover(res, AT),
                            textfile.check(check.CheckResult(), AT), textfile.alerts([], AT)) for n, _ in parse(text)}
    assert names <= set(METRICS)


def test_alerts_run_writes_when_it_ran_and_what_it_sent_and_could_not():
    from gpuhpc.ledger.alerts import Alert

    def alert(status):
        a = Alert.__new__(Alert)
        a.status = status
        return a

    got = parse(textfile.alerts([alert("sent"), alert("failed"), alert("sent"), alert("due")], AT))
    assert got == {("gpuhpc_ledger_alerts_timestamp_seconds", ()): AT.timestamp(),
                   ("gpuhpc_ledger_alerts_sent", ()): 2, ("gpuhpc_ledger_alerts_failed", ()): 1}


def test_drift_counts_associations_whose_limits_or_usage_differ():
    D = check.Difference
    res = check.CheckResult(differences=[
        D("weights", "partition gpu", "a", "b", "fix"),                 # not an association
        D("limits", "account proj", "a", "b", "fix"),
        D("usage", "account proj", "a", "b", "fix"),                    # the same association: once
        D("usage", "user bob in account proj", "a", "b", "fix"),
        D("reset", "account other", "a", "b", "fix")])
    got = parse(textfile.check(res, AT))
    assert got[("gpuhpc_ledger_drift_associations", ())] == 3
    assert got[("gpuhpc_ledger_drift", (("kind", "usage"),))] == 2
    assert got[("gpuhpc_ledger_check_timestamp_seconds", ())] == AT.timestamp()
    assert parse(textfile.check(check.CheckResult(), AT))[("gpuhpc_ledger_drift_associations", ())] == 0


def render_rules() -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    variables = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables.update(ansible_managed="managed by Ansible")
    return env.get_template("gpuhpc-rules.yml.j2").render(**variables)


def _fired(name: str, instance: str, summary: str, description: str, severity: str) -> dict:
    return {"exp_labels": {"job": "node", "instance": instance, "node": "ctl1", "severity": severity,
                           "gpuhpc": "ledger"},
            "exp_annotations": {"summary": summary, "description": description}}


def test_outage_alerts_fire_on_their_conditions(tmp_path):
    """promtool on the rules the role installs: an ingest and a sync-slurm whose last success stops
    advancing at 30m (the database goes away) fire an hour later (45m old, for 15m), not before;
    ones that keep succeeding every 15m never fire; drift for 1h fires, drift that a sync puts
    right within 30m does not. The age is recorded as a series of its own."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is needed; scripts/bootstrap.sh installs it"
    (tmp_path / "rules.yml").write_text(render_rules())
    lab = '{job="node",instance="%s",node="ctl1"}'
    # a success timestamp in seconds, sampled every minute: it advances every 15 minutes while the
    # command succeeds (at 0, 15, 30 min), then stays at 1800 (stuck) or keeps advancing (healthy)
    stuck = " ".join(str(60 * 15 * min(m // 15, 2)) for m in range(0, 151))
    healthy = " ".join(str(60 * 15 * (m // 15)) for m in range(0, 151))
    ing = "gpuhpc_ledger_ingest_success_timestamp_seconds" + lab
    syn = "gpuhpc_ledger_sync_success_timestamp_seconds" + lab
    drift = "gpuhpc_ledger_drift_associations" + lab
    ran = "gpuhpc_ledger_alerts_timestamp_seconds" + lab
    failed = "gpuhpc_ledger_alerts_failed" + lab
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": ing % "ctl1:9100", "values": stuck},
            {"series": ing % "ok:9100", "values": healthy},
            {"series": syn % "ctl1:9100", "values": stuck},
            {"series": syn % "ok:9100", "values": healthy},
            {"series": drift % "ctl1:9100", "values": "0x10 2x140"},            # 2 associations from 10m on
            {"series": drift % "ok:9100", "values": "0x10 1x29 0x110"},         # 30m of drift, then in step
            {"series": ran % "ctl1:9100", "values": stuck},
            {"series": ran % "ok:9100", "values": healthy},
            {"series": failed % "ctl1:9100", "values": "0x10 3x140"},           # 3 unsent from 10m on
            {"series": failed % "ok:9100", "values": "0x10 1x14 0x125"},        # one run failed, the next sent
        ],
        "promql_expr_test": [{"expr": "gpuhpc:ledger_ingest_age_seconds", "eval_time": "50m", "exp_samples": [
            {"labels": "gpuhpc:ledger_ingest_age_seconds" + lab % "ctl1:9100", "value": 1200},
            {"labels": "gpuhpc:ledger_ingest_age_seconds" + lab % "ok:9100", "value": 300}]}],
        "alert_rule_test": [
            {"eval_time": "89m", "alertname": "LedgerIngestStale", "exp_alerts": []},
            {"eval_time": "92m", "alertname": "LedgerIngestStale", "exp_alerts": [_fired(
                "LedgerIngestStale", "ctl1:9100", "gpuhpc ledger ingest on ctl1:9100 last succeeded 1h 2m 0s ago",
                "Usage since then is not settled: budgets' use, reports and the budget snapshot are behind. "
                "Look at the ingest's log (the database, sacct).", "warning")]},
            {"eval_time": "89m", "alertname": "LedgerSyncStale", "exp_alerts": []},
            {"eval_time": "150m", "alertname": "LedgerSyncStale", "exp_alerts": [_fired(
                "LedgerSyncStale", "ctl1:9100", "gpuhpc ledger sync-slurm on ctl1:9100 last succeeded 2h 0m 0s ago",
                "Slurm's budget limits and the reset plan are not refreshed: quota changes do not reach Slurm, and "
                "period resets rest on gpuhpc ledger rollover and the plan it last got. Look at the sync's log "
                "(the database, sacctmgr).", "critical")]},
            {"eval_time": "69m", "alertname": "LedgerSlurmDrift", "exp_alerts": []},
            {"eval_time": "71m", "alertname": "LedgerSlurmDrift", "exp_alerts": [_fired(
                "LedgerSlurmDrift", "ctl1:9100", "2 associations in Slurm differ from the ledger (on ctl1:9100)",
                "gpuhpc ledger check has found limits or usage in Slurm that are not the ledger's for 1h: run "
                "gpuhpc ledger check for each difference and its fix.", "warning")]},
            # last ran through at 30m: an hour old at 90m, for 15m: fires at 105m, not at 104m
            {"eval_time": "104m", "alertname": "LedgerAlertsStale", "exp_alerts": []},
            {"eval_time": "106m", "alertname": "LedgerAlertsStale", "exp_alerts": [_fired(
                "LedgerAlertsStale", "ctl1:9100", "gpuhpc ledger alerts on ctl1:9100 last ran through 1h 16m 0s ago",
                "Budget alerts (80 %, 100 %) are not being sent to account contacts. Look at the alerts' log "
                "(the database).", "warning")]},
            {"eval_time": "39m", "alertname": "LedgerAlertsUndelivered", "exp_alerts": []},
            {"eval_time": "41m", "alertname": "LedgerAlertsUndelivered", "exp_alerts": [_fired(
                "LedgerAlertsUndelivered", "ctl1:9100", "3 budget alerts could not be sent (on ctl1:9100)",
                "gpuhpc ledger alerts has failed to mail or POST budget alerts for 30m: run gpuhpc ledger alerts "
                "--dry-run and check each account's contact (gpuhpc ledger account set --contact) and the mail "
                "relay.", "warning")]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
