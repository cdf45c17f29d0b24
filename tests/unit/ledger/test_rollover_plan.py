"""The reset plan sync-slurm writes and `gpuhpc ledger rollover`, which applies it without the
database (issue 34 point 4); Slurm through a recording runner (the real cluster:
tests/integration/ledger/test_ledger_rollover.py)."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from decimal import Decimal

from gpuhpc.ledger import admin, adjust, rollover, slurm_sync
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport import CommandResult

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 15, 12, tzinfo=UTC)


def ts(*args) -> int:
    return int(dt.datetime(*args, tzinfo=UTC).timestamp())


class Recorder:
    """A Runner that records every sacctmgr modify (as gpuhpc.slurm builds it) and can fail one."""

    is_local = False

    def __init__(self, fail_for: str | None = None):
        self.calls: list[tuple[str, ...]] = []
        self.fail_for = fail_for

    def run(self, argv, *, input=None, timeout=None, env=None):
        if argv == ["scontrol", "show", "config"]:            # sync-slurm's (the rollover names the plan's)
            return CommandResult(tuple(argv), 0, "ClusterName = lab\n", "")
        if argv[:4] == ["sacctmgr", "--noheader", "--parsable2", "list"]:
            return CommandResult(tuple(argv), 0, "proj||\nproj|alice|\nproj|bob|\n", "")
        assert argv[:2] == ["sacctmgr", "-i"], argv           # else nothing but sacctmgr's modify
        if self.fail_for and f"name={self.fail_for}" in argv:
            return CommandResult(tuple(argv), 1, "", " Nothing modified\n")
        self.calls.append(tuple(argv[2:]))
        return CommandResult(tuple(argv), 0, "", "")


def _ledger(url):
    admin.add_account("proj", url=url)
    admin.add_user("alice", "proj", url=url)
    admin.add_user("bob", "proj", url=url)
    admin.set_quota("proj", gpu_hours=Decimal("10"), period="month", url=url)
    admin.set_quota("proj", user="bob", gpu_hours=Decimal("1"), period="day", url=url)
    admin.add_account("forever", url=url)
    admin.set_quota("forever", gpu_hours=Decimal("5"), period="total", url=url)


def test_plan_has_each_quotas_next_period_starts_and_limits(ledger_url, tmp_path):
    _ledger(ledger_url)
    # a credit this month raises this month's limit only: the next periods get the plain budget
    adjust.adjust("proj", kind="credit", gpu_hours="2", reason="NODE_FAIL refund", at=NOW, url=ledger_url)
    (now_plan,) = [p for p in slurm_sync.plan(url=ledger_url, now=NOW) if p.account == "proj"]
    assert now_plan.limits["gres/gpu"] == 718                   # 12 GPU-hours less 2 minutes of headroom
    path = rollover.publish("lab", url=ledger_url, now=NOW, tz=UTC, path=tmp_path / rollover.PLAN_NAME)
    plan = rollover.read_plan(path)
    assert plan is not None and plan.cluster == "lab" and plan.generated == int(NOW.timestamp())
    by = {e.key: e for e in plan.entries}
    assert set(by) == {"proj/", "proj/bob"}                     # a total quota never resets
    acct = by["proj/"]
    assert (acct.period, acct.current) == ("month", ts(2026, 11, 1))
    assert [r.at for r in acct.resets] == [ts(2026, 12, 1), ts(2027, 1, 1), ts(2027, 2, 1)]
    assert all(r.limits == {"gres/gpu": 598, "billing": -1} for r in acct.resets)
    bob = by["proj/bob"]
    assert (bob.period, bob.current) == ("day", ts(2026, 11, 15))
    assert [r.at for r in bob.resets] == [ts(2026, 11, 16), ts(2026, 11, 17), ts(2026, 11, 18)]
    assert bob.resets[0].limits == {"gres/gpu": 58, "billing": -1}
    doc = json.loads(path.read_text())
    assert doc["quotas"][0]["resets"][0] == {"at": ts(2026, 12, 1), "GrpTRESMins": {"billing": -1, "gres/gpu": 598}}
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_plan_follows_the_accounting_zone(ledger_url, tmp_path, monkeypatch):
    from zoneinfo import ZoneInfo

    _ledger(ledger_url)
    site = tmp_path / "site.toml"
    site.write_text('[ledger]\ntimezone = "Europe/Berlin"\n')
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(site))
    berlin = ZoneInfo("Europe/Berlin")
    acct = {e.key: e for e in rollover.compute("lab", url=ledger_url, now=NOW).entries}["proj/"]
    assert acct.current == int(dt.datetime(2026, 11, 1, tzinfo=berlin).timestamp())
    assert [r.at for r in acct.resets] == [int(dt.datetime(y, m, 1, tzinfo=berlin).timestamp())
                                          for y, m in ((2026, 12), (2027, 1), (2027, 2))]
    # boundaries that sync-slurm's own periods do not have (another zone) are never planned
    tokyo = {e.key: e for e in rollover.compute("lab", url=ledger_url, now=NOW, tz=ZoneInfo("Asia/Tokyo")).entries}
    assert tokyo["proj/"].resets == () and tokyo["proj/bob"].resets == ()


def _plan() -> rollover.Plan:
    return rollover.Plan("lab", ts(2026, 11, 30, 23, 50), [
        rollover.Entry("proj", "", "month", ts(2026, 11, 1), (
            rollover.Reset(ts(2026, 12, 1), {"gres/gpu": 598, "billing": -1}),
            rollover.Reset(ts(2027, 1, 1), {"gres/gpu": 298, "billing": -1}))),
        rollover.Entry("proj", "bob", "day", ts(2026, 11, 30), (
            rollover.Reset(ts(2026, 12, 1), {"gres/gpu": 58, "billing": -1}),
            rollover.Reset(ts(2026, 12, 2), {"gres/gpu": 58, "billing": -1}))),
    ])


def test_rollover_resets_each_association_once_at_its_boundary(tmp_path):
    state_file = tmp_path / rollover.STATE_NAME
    c = SlurmClient(Recorder())
    state: dict[str, int] = {}
    before = rollover.apply(c, _plan(), state, now=ts(2026, 11, 30, 23, 59, 59), state_file=state_file)
    assert c.runner.calls == [] and before.applied == [] and before.next_reset == ts(2026, 12, 1)
    after = rollover.apply(c, _plan(), state, now=ts(2026, 12, 1, 0, 0, 30), state_file=state_file)
    # the new period's limit, then its usage from zero: on the plan's cluster only
    assert c.runner.calls == [
        ("modify", "account", "where", "name=proj", "cluster=lab", "set", "GrpTRESMins=billing=-1,gres/gpu=598"),
        ("modify", "account", "where", "name=proj", "cluster=lab", "set", "RawUsage=0"),
        ("modify", "user", "where", "name=bob", "account=proj", "cluster=lab", "set", "GrpTRESMins=billing=-1,gres/gpu=58"),
        ("modify", "user", "where", "name=bob", "account=proj", "cluster=lab", "set", "RawUsage=0")]
    assert len(after.applied) == 2 and after.next_reset == ts(2026, 12, 2)
    assert rollover.read_state(state_file) == {"proj/": ts(2026, 12, 1), "proj/bob": ts(2026, 12, 1)}
    # run again (cron, a minute later; a new process reading the state): nothing more
    c.runner.calls.clear()
    rollover.apply(c, _plan(), rollover.read_state(state_file), now=ts(2026, 12, 1, 0, 1, 30), state_file=state_file)
    assert c.runner.calls == []
    # the database away for a month: the account resets once, to the latest period's limit
    c2 = SlurmClient(Recorder())
    rollover.apply(c2, _plan(), {}, now=ts(2027, 1, 1, 0, 5), state_file=tmp_path / "other.json")
    assert [x for x in c2.runner.calls if x[1] == "account"] == [
        ("modify", "account", "where", "name=proj", "cluster=lab", "set", "GrpTRESMins=billing=-1,gres/gpu=298"),
        ("modify", "account", "where", "name=proj", "cluster=lab", "set", "RawUsage=0")]


def test_a_failed_reset_is_reported_and_tried_again(tmp_path):
    state_file = tmp_path / rollover.STATE_NAME
    state: dict[str, int] = {}
    res = rollover.apply(SlurmClient(Recorder(fail_for="bob")), _plan(), state, now=ts(2026, 12, 1, 0, 1),
                         state_file=state_file)
    assert [e.key for e, _ in res.applied] == ["proj/"] and [e.key for e, _, _ in res.failed] == ["proj/bob"]
    assert "Nothing modified" in res.failed[0][2]
    assert rollover.read_state(state_file) == {"proj/": ts(2026, 12, 1)}
    c = SlurmClient(Recorder())
    rollover.apply(c, _plan(), rollover.read_state(state_file), now=ts(2026, 12, 1, 0, 2), state_file=state_file)
    assert [x[3:5] for x in c.runner.calls] == [("name=bob", "account=proj")] * 2


def test_no_plan_or_an_unreadable_one_resets_nothing(tmp_path):
    (tmp_path / rollover.PLAN_NAME).write_text("{not json")
    c = SlurmClient(Recorder())
    res = rollover.run(c, base=tmp_path, now=ts(2027, 1, 1))
    assert res.plan_generated is None and res.applied == [] and c.runner.calls == []
    assert rollover.read_plan(tmp_path / "missing.json") is None


def test_sync_slurm_leaves_the_rollovers_resets_alone(ledger_url):
    _ledger(ledger_url)
    month = dt.datetime(2026, 12, 1, tzinfo=UTC)
    slurm_sync.record_periods(slurm_sync.plan(url=ledger_url, now=NOW), url=ledger_url)
    # December began while the database was away: the ledger still remembers November
    (p,) = [p for p in slurm_sync.plan(url=ledger_url, now=month + dt.timedelta(hours=3)) if p.account == "proj"]
    assert p.reset and p.user_resets == ("bob",)
    # the rollover reset the account's December and bob's 1 December, not bob's 2 December
    state = {"proj/": int(month.timestamp()), "proj/bob": int(month.timestamp())}
    (q,) = rollover.without_done([p], state)
    assert not q.reset and q.user_resets == ()
    (r,) = rollover.without_done([p], {})
    assert r == p
    (p2,) = [p for p in slurm_sync.plan(url=ledger_url, now=month + dt.timedelta(days=1, hours=1)) if p.account == "proj"]
    (q2,) = rollover.without_done([p2], state)
    assert not q2.reset and q2.user_resets == ("bob",)
    # what sync-slurm then runs: no RawUsage=0 (the limits are in place already)
    assert [c for c in slurm_sync.sync(SlurmClient(Recorder()), [p], dry_run=True).commands if "RawUsage=0" in c]
    assert [c for c in slurm_sync.sync(SlurmClient(Recorder()), [q], dry_run=True).commands
            if "RawUsage=0" in c] == []


def test_the_rollover_imports_no_database_module(tmp_path):
    """`gpuhpc ledger rollover`'s own modules (the CLI group, the rollover, the Slurm client) load
    neither sqlalchemy nor the ledger's database module: it works with the database gone."""
    code = ("import sys; import gpuhpc.cli.ledger; from gpuhpc.ledger import rollover, textfile; "
            "from gpuhpc.slurm.client import SlurmClient; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'psycopg', 'alembic') "
            "or m in ('gpuhpc.ledger.db', 'gpuhpc.ledger.orm', 'gpuhpc.ledger.slurm_sync')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_plan_follows_allocation_windows(ledger_url):
    """A quota on an allocation window (90 days from 5 January) resets at each window's end."""
    admin.add_account("grant", url=ledger_url)
    admin.set_quota("grant", gpu_hours=Decimal("100"), period="2026-01-05/P90D", url=ledger_url)
    (e,) = rollover.compute("lab", url=ledger_url, now=NOW, tz=UTC).entries
    start = dt.datetime(2026, 1, 5, tzinfo=UTC)
    assert (e.period, e.current) == ("2026-01-05/P90D", int((start + dt.timedelta(days=270)).timestamp()))
    assert [r.at for r in e.resets] == [int((start + dt.timedelta(days=90 * k)).timestamp()) for k in (4, 5, 6)]
    assert e.resets[0].limits == {"gres/gpu": 5998, "billing": -1}


def test_sync_slurm_records_its_resets_so_an_old_plan_does_not_redo_them(ledger_url, tmp_path):
    _ledger(ledger_url)
    month = dt.datetime(2026, 12, 1, tzinfo=UTC)
    slurm_sync.record_periods(slurm_sync.plan(url=ledger_url, now=NOW), url=ledger_url)
    old_plan = rollover.compute("lab", url=ledger_url, now=NOW, tz=UTC)        # written in November
    # sync-slurm, the database up, makes December's resets itself at 00:07
    plans = slurm_sync.plan(url=ledger_url, now=month + dt.timedelta(minutes=7))
    state_file = tmp_path / rollover.STATE_NAME
    state: dict[str, int] = {}
    rollover.mark_done(plans, state, state_file)
    assert rollover.read_state(state_file) == {"proj/": int(month.timestamp()), "proj/bob": int(month.timestamp())}
    # a rollover that still reads November's plan (sync-slurm has not written the new one yet)
    c = SlurmClient(Recorder())
    res = rollover.apply(c, old_plan, rollover.read_state(state_file), now=(month + dt.timedelta(minutes=8)).timestamp())
    assert c.runner.calls == [] and res.applied == []


def test_sync_slurm_reads_the_database_outside_the_rollovers_lock(ledger_url, tmp_path, monkeypatch):
    """While sync-slurm waits for the database (here: reads it, then finds it gone), the rollover's
    lock is free: a hung database never keeps the rollover from resetting."""
    import fcntl
    import os

    from gpuhpc.cli.main import main
    from gpuhpc.errors import LedgerError

    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path))
    free = []

    def plan_while_the_database_hangs(**kw):
        fd = os.open(tmp_path / rollover.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)    # raises BlockingIOError when held
            free.append(True)
        finally:
            os.close(fd)
        raise LedgerError("the database went away")

    monkeypatch.setattr(slurm_sync, "plan", plan_while_the_database_hangs)
    assert main(["ledger", "sync-slurm"]) == 1
    assert free == [True]


def test_a_plan_or_state_others_may_write_is_refused(tmp_path):
    import pytest

    from gpuhpc.errors import GpuhpcError

    plan = tmp_path / rollover.PLAN_NAME
    plan.write_text(rollover.render(_plan()))
    c = SlurmClient(Recorder())
    for f in (plan, tmp_path / rollover.STATE_NAME):
        f.touch()
        f.chmod(0o666)
        with pytest.raises(GpuhpcError, match="refused, nothing reset"):
            rollover.run(c, base=tmp_path, now=ts(2026, 12, 1, 0, 1))
        assert c.runner.calls == []
        f.chmod(0o644)
    (tmp_path / rollover.STATE_NAME).unlink()
    assert len(rollover.run(c, base=tmp_path, now=ts(2026, 12, 1, 0, 1)).applied) == 2
