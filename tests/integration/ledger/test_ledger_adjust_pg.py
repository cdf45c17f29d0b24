"""Credits, debits and corrections on the running PostgreSQL AND SQLite (issue 34.7): the charges,
adjustments and audit tables refuse UPDATE, DELETE (and TRUNCATE) for every role, the migration
owner included; an adjustment, a corrected rate and a NODE_FAIL refund by policy count in the
budget and the report; a reader sees its own accounts' adjustments only and no audit trail; the
migration goes down and up again; finance's line items and burn forecast over the same charges."""
from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DatabaseError

from gpuhpc.ledger import adjust, admin, db, ingest, reports
from gpuhpc.slurm.commands import SACCT_RUN_FIELDS, SEP
from gpuhpc.slurm.parsers import parse_sacct

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
START = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)


def _rows(*runs: tuple[str, str]):
    """sacct rows (job id, state): 8 h100 for 1800 s from START (8 × 0.5 h × 2.50 = 10.00 each)."""
    lines = []
    for job, state in runs:
        tres = "cpu=1,gres/gpu:h100=8,gres/gpu=8,node=1"
        t = START.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
        e = (START + dt.timedelta(seconds=1800)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
        d = {"JobID": job, "JobIDRaw": job, "JobName": "train", "State": state, "Elapsed": "", "ElapsedRaw": "1800",
             "Submit": t, "Start": t, "End": e, "AllocTRES": tres, "ReqTRES": tres, "Partition": "gpu",
             "Account": "research", "User": "alice", "QOS": "normal", "Cluster": "local", "Timelimit": "01:00:00"}
        lines.append(SEP.join(d[f] for f in SACCT_RUN_FIELDS))
    return parse_sacct("\n".join(lines), fields=SACCT_RUN_FIELDS)


def _used(url) -> Decimal:
    (st,) = admin.quota_status("research", url=url)
    return st.used_money


def test_adjustments_on_an_append_only_ledger(any_url):
    db.upgrade(any_url)
    admin.add_account("research", url=any_url)
    admin.add_user("alice", "research", default=True, url=any_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=any_url)
    admin.set_quota("research", money=Decimal("100"), url=any_url)
    data = _rows(("300", "COMPLETED"), ("301", "NODE_FAIL"))
    ingest.ingest_rows(data, url=any_url)
    assert _used(any_url) == Decimal("20.000000")
    stmts = ["UPDATE charges SET amount = 0", "DELETE FROM charges", "DELETE FROM usage_records"]
    if any_url.startswith("postgresql"):
        stmts.append("TRUNCATE charges CASCADE")
    for sql in stmts:            # as the migrations' own role (the owner: row-level security does not bind it)
        with pytest.raises(DatabaseError, match="charges is append-only"):
            with db.get_engine(any_url).begin() as c:
                c.execute(text(sql))
    adjust.adjust("research", kind="credit", amount="4", reason="goodwill", url=any_url)
    adjust.set_policy("node_fail_refund", "on", url=any_url)
    assert ingest.ingest_rows(data, url=any_url).refunds == 1
    since, until = START - dt.timedelta(days=1), START + dt.timedelta(days=1)
    b = adjust.reprice("h100", "2.00", since=since, until=until, reason="rate typo", url=any_url)
    # 300 nets 4 GPU-h: -2.00; 301 was refunded (nets 0): nothing
    assert (b.charges, b.amount) == (1, Decimal("-2.000000"))
    assert adjust.reprice("h100", "2.00", since=since, until=until, reason="rate typo", url=any_url).charges == 0
    assert _used(any_url) == Decimal("4.000000")                   # 20 - 4 - 10 - 2
    assert reports.cost_report(by="account", url=any_url).total == Decimal("4.000000")
    # finance's line items add up to the same, and the forecast reads the same charges (issue 34.10)
    lines = reports.job_lines(url=any_url)
    assert sum(Decimal(x["total"]) for x in lines) == Decimal("4.000000")
    assert reports.lines_csv(lines).count("\r\n") == len(lines) + 1
    (burn,) = reports.burn_forecast(days=7, url=any_url)
    assert burn.remaining == Decimal("96.000000") and burn.per_day == Decimal("0.571429")      # 4.00 / 7
    for sql in ("UPDATE adjustments SET amount = 0", "DELETE FROM ledger_audit"):
        with pytest.raises(DatabaseError, match="is append-only"):
            with db.get_engine(any_url).begin() as c:
                c.execute(text(sql))
    assert [a["kind"] for a in adjust.list_adjustments(url=any_url)] == ["credit", "refund", "correction"]
    actions = [a["action"] for a in adjust.audit_entries(url=any_url)]
    assert actions[-4:] == ["adjust.credit", "policy.set", "adjust.refund", "reprice"]
    if any_url.startswith("postgresql"):
        _reader_sees_own_adjustments_and_no_audit(any_url)
    # the migration goes down (the adjustments' charges with it) and up again
    db.downgrade(any_url, "0008")
    with db.get_engine(any_url).begin() as c:
        assert c.execute(text("SELECT count(*) FROM charges")).scalar() == 2
        c.execute(text("UPDATE charges SET amount = amount"))      # no trigger at 0008
    assert db.upgrade(any_url) == ("0008", db.SCHEMA_HEAD)


def _reader_sees_own_adjustments_and_no_audit(pg_url: str) -> None:
    adjust.adjust("research", kind="debit", amount="1", reason="someone else's", url=pg_url)
    admin.add_account("other", url=pg_url)
    adjust.adjust("other", kind="debit", amount="1", reason="not alice's", url=pg_url)
    tag = uuid.uuid4().hex[:8]
    reader = f"gpuhpc_u_{tag}"
    sup = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with sup.connect() as c:
        c.execute(text(f"CREATE ROLE {reader} LOGIN PASSWORD '{tag}' IN ROLE gpuhpc_reader"))
    admin.add_user(reader, "research", url=pg_url)
    url = make_url(pg_url).set(username=reader, password=tag).render_as_string(hide_password=False)
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            assert {r[0] for r in c.execute(text("SELECT account_name FROM adjustments"))} == {"research"}
        with eng.connect() as c, pytest.raises(DatabaseError, match="permission denied"):
            c.execute(text("SELECT count(*) FROM ledger_audit"))
        with eng.connect() as c, pytest.raises(DatabaseError, match="permission denied"):
            c.execute(text("INSERT INTO adjustments (kind, account_name, user_name, gpu_hours, amount, reason, "
                           "detail, bucket_at, created_by, created_at) VALUES ('credit', 'research', '', 0, -99, "
                           "'x', '', now(), 'me', now())"))
    finally:
        eng.dispose()
        with sup.connect() as c:
            c.execute(text(f"DROP OWNED BY {reader}"))
            c.execute(text(f"DROP ROLE {reader}"))
        sup.dispose()
