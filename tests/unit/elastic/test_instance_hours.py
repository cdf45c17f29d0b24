"""Instance-hours from the elastic journal (gpuhpc.elastic.journal -> gpuhpc.ledger.instances):
the parts of each instance's life add up to it, prices are those at launch, spot savings are
against the on-demand price, and re-ingesting the same journal changes nothing."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

from gpuhpc.elastic import journal
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.ledger import db, instances

T0 = 1_800_000_000.0
CFG = ElasticConfig(cluster="c", state_dir="/nonexistent", pools=(
    Pool("spot", ("s1", "s2"), "local", market="spot", hourly_price="1.2", on_demand_hourly_price="4"),
    Pool("od", ("o1",), "local", hourly_price="4")))


def test_parts_add_up_and_spot_saves_against_on_demand(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    db.upgrade(url)
    spot, od = CFG.pool("spot"), CFG.pool("od")
    ev = [
        # spot: 10 min boot, 1 h busy, 10 min idle, 5 min suspend
        journal.launch_event(CFG, spot, Instance("i-1", "s1", "spot", "running", T0, "g5", "spot")),
        journal.end_event(CFG, "i-1", T0 + 4800, "suspend", registered_at=T0 + 600, last_busy=T0 + 4200,
                          suspend_at=T0 + 4500),
        # a reclaim: busy until the end
        journal.launch_event(CFG, spot, Instance("i-2", "s2", "spot", "running", T0, "g5", "spot")),
        journal.end_event(CFG, "i-2", T0 + 1800, "reclaim", registered_at=T0 + 300),
        # on demand that never booted
        journal.launch_event(CFG, od, Instance("i-3", "o1", "od", "running", T0, "g5", "on_demand")),
        journal.end_event(CFG, "i-3", T0 + 900, "boot-failed"),
        # an orphan, journalled only at its end
        journal.end_event(CFG, "i-4", T0 + 1200, "orphan", orphan=Instance("i-4", "o1", "od", "running", T0, "g5"),
                          pool=od),
    ]
    assert instances.ingest(ev, url) == 4
    assert instances.ingest(ev, url) == 0                          # settled rows are not rewritten
    rep = instances.instance_report(url=url, now=dt.datetime.fromtimestamp(T0 + 9999, dt.timezone.utc))
    rows = {(r.instance_type, r.market): r for r in rep.rows}
    s = rows[("g5", "spot")]
    assert s.instances == 2
    # boot 600 + 300 s, busy 3600 + 1500 s, idle 300 s, suspend 300 s
    assert s.seconds == {"boot": 900, "busy": 5100, "idle": 300, "suspend": 300, "orphan": 0}
    hours = Decimal(6600) / 3600
    assert s.hours == hours and s.cost == hours * Decimal("1.2")
    assert s.spot_savings == hours * Decimal(4) - hours * Decimal("1.2")
    o = rows[("g5", "on_demand")]
    assert o.seconds["boot"] == 900 and o.seconds["orphan"] == 1200 and o.spot_savings == 0
    tot = instances.totals(rep.rows)
    assert tot["instance_hours"] == sum((tot[f"{p}_hours"] for p in instances.PARTS), Decimal(0))


def test_the_journal_appends_and_skips_a_torn_line(tmp_path):
    journal.append(tmp_path, {"event": "launch", "id": "a"}, {"event": "end", "id": "a"})
    with open(journal.path(tmp_path), "a") as fh:
        fh.write('{"event": "lau')
    assert [e["event"] for e in journal.read(tmp_path)] == ["launch", "end"]


def _numbers(page: str, table_id: str) -> list[list[str]]:
    """The cells of each row of the table ``table_id`` in ``page``."""
    from html.parser import HTMLParser

    class P(HTMLParser):
        rows: list[list[str]] = []
        inside = cell = False

        def handle_starttag(self, tag, attrs):
            if tag == "table" and ("id", table_id) in attrs:
                self.inside = True
            elif self.inside and tag == "tr":
                self.rows.append([])
            elif self.inside and tag == "td":
                self.cell = True
                self.rows[-1].append("")

        def handle_endtag(self, tag):
            self.inside = self.inside and tag != "table"
            self.cell = self.cell and tag != "td"

        def handle_data(self, data):
            if self.inside and self.cell:
                self.rows[-1][-1] += data

    p = P()
    p.rows = []
    p.feed(page)
    return [r for r in p.rows if r]


def test_the_html_cost_page_shows_the_instance_hours_and_they_add_up(tmp_path):
    """The cost page (gpuhpc report cost --html) gets the text report's instance-hours: per type
    and market, split into boot, busy, idle, suspend and orphan that add up to the total row,
    cost and spot savings, and the jobs' GPU-hours of the same range, equal to the cost table's."""
    from gpuhpc.ledger import reports

    url = f"sqlite:///{tmp_path / 'l.db'}"
    db.upgrade(url)
    spot = CFG.pool("spot")
    instances.ingest([
        journal.launch_event(CFG, spot, Instance("i-1", "s1", "spot", "running", T0, "g5", "spot")),
        journal.end_event(CFG, "i-1", T0 + 4800, "suspend", registered_at=T0 + 600, last_busy=T0 + 4200,
                          suspend_at=T0 + 4500),
        journal.end_event(CFG, "i-4", T0 + 1200, "orphan", orphan=Instance("i-4", "o1", "od", "running", T0, "g5"),
                          pool=CFG.pool("od"))], url)
    inst = instances.instance_report(url=url)
    day = dt.datetime.fromtimestamp(T0, dt.timezone.utc)
    cost = reports.CostReport("account", "day", [reports.CostRow(day, "research", gpu_hours=Decimal("6.5"),
                                                                 cost=Decimal("13"), jobs={"1"})],
                              [], {"g5": Decimal("13")}, Decimal("13"))
    inst.job_gpu_hours = Decimal("6.5")                   # the same range's runs (sqlite holds none here)
    page = reports.render_html(cost, instances=inst)
    assert "<h2>Elastic instances</h2>" in page and page.count("<svg") == 3 and "<script" not in page
    body = _numbers(page, "instances")
    assert [r[:3] for r in body] == [["g5", "on_demand", "1"], ["g5", "spot", "1"], ["total", "", "2"]]
    for r in body:                                        # instance-h = boot + busy + idle + suspend + orphan
        assert abs(float(r[3]) - sum(float(x) for x in r[4:9])) < 0.002, r
    assert [float(x) for x in body[-1][3:9]] == [1.667, 0.167, 1.0, 0.083, 0.083, 0.333]
    assert float(body[-1][10]) == round(4800 / 3600 * (4 - 1.2), 2)          # spot savings
    assert "Jobs in the same range: 6.50 GPU-hours" in " ".join(page.split())
    assert reports.render_html(cost, instances=instances.InstanceReport([], Decimal(0), Decimal(0))).count("<svg") == 2
