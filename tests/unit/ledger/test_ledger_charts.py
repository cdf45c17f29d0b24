"""Charts from matplotlib (gpuhpc.reports.charts): round ticks, the top one at or above the data,
inline SVG that works without a writable home."""
from __future__ import annotations

import datetime as dt
import math
import os
import re
import subprocess
import sys
from decimal import Decimal

import pytest

from gpuhpc.ledger import reports
from gpuhpc.reports import charts


def _round(t: float, step: float) -> bool:
    k = t / step
    return abs(k - round(k)) < 1e-9


@pytest.mark.parametrize("vmax", [0.045, 0.05, 1, 7, 9.99, 10, 123456, 0.0012, 2.5e7, 0])
def test_ticks_are_round_and_cover_the_maximum(vmax):
    ticks = charts.nice_ticks(vmax)
    assert ticks[0] == 0 and ticks[-1] >= vmax and 3 <= len(ticks) <= 7
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(abs(mantissa - m) < 1e-9 for m in (1, 2, 2.5, 5)), step
    assert all(_round(t, step) for t in ticks)
    assert ticks[-2] < vmax or vmax == 0                     # no empty band above the data


def _labels(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_cost_chart_of_the_quickstart_total():
    # the quickstart's total was 0.045: the hand-drawn chart's top gridline read 0.05 at max/4 steps
    day = dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)
    rows = [reports.CostRow(day, "research", cost=Decimal("0.030")), reports.CostRow(day, "ops", cost=Decimal("0.015"))]
    rep = reports.CostReport("account", "day", rows, [], {"h100": Decimal("0.045")}, Decimal("0.045"))
    svg = reports._svg_stacked(rep)
    assert svg.startswith("<svg") and "<script" not in svg
    labels = _labels(svg)
    assert [x for x in labels if re.fullmatch(r"[0-9.]+", x)] == ["0.00", "0.01", "0.02", "0.03", "0.04", "0.05"]
    assert "research" in labels and "ops" in labels and "2026-11-30" in labels
    bars = reports._svg_bars(rep.by_gpu_type)
    assert "h100" in _labels(bars) and "0.04" in _labels(bars)          # the bar's value at its end, 0.04(5)
    page = reports.render_html(rep)
    assert page.count("<svg") == 2


def test_many_keys_stack_the_rest_as_other():
    day = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    rows = [reports.CostRow(day + dt.timedelta(days=d), f"user{k:02d}", cost=Decimal(k + 1))
            for d in range(3) for k in range(12)]
    rep = reports.CostReport("user", "day", rows, [], {}, sum((r.cost for r in rows), Decimal(0)))
    labels = _labels(reports._svg_stacked(rep))
    assert "other" in labels and "user11" in labels and "user00" not in labels
    assert max(float(x) for x in labels if re.fullmatch(r"[0-9.,]+", x)) >= 78       # 12+11+...+1 per day


def test_lines_and_scatter():
    svg = charts.lines([1, 2, 3], {"loss": [3.0, 2.0, 1.5], "val": [3.1, 2.2, 1.9]}, xlabel="step", ylabel="loss")
    assert "loss" in _labels(svg) and "val" in _labels(svg)
    assert charts.lines([1, 2], {"a": [1, 2]}, scatter=True, from_zero=True).startswith("<svg")


def test_works_without_a_writable_home(tmp_path):
    env = {**os.environ, "HOME": "/nonexistent/gpuhpc-home", "PYTHONPATH": os.getcwd()}
    env.pop("MPLCONFIGDIR", None)
    code = ("import os; from gpuhpc.reports import charts; svg = charts.hbars({'h100': 1.5}); "
            "print(os.environ['MPLCONFIGDIR'].startswith(__import__('tempfile').gettempdir()), svg[:4])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "<svg"]
