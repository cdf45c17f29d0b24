"""The ledger CLI groups: db, ledger, quota, report (no Slurm needed)."""
from __future__ import annotations

import json

import pytest

from gpuhpc.cli.main import main


@pytest.fixture()
def cli_db(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUHPC_DB_URL", raising=False)
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path))
    return tmp_path


def test_admin_flow_and_reports(cli_db, capsys, tmp_path):
    assert main(["quota", "show"]) == 1                      # no schema yet
    assert "gpuhpc db upgrade" in capsys.readouterr().err
    assert main(["db", "upgrade"]) == 0
    assert main(["db", "upgrade"]) == 0
    assert "already at" in capsys.readouterr().err
    book = tmp_path / "prices.yaml"
    book.write_text('effective_from: 2026-01-01\ngpus:\n  h100: "2.50"\n  "3g.40gb": {of: h100, fraction: "3/7"}\n'
                    'partitions: {gpu: "0.6"}\nqos: {low: "0.5"}\n')
    assert main(["ledger", "price", "load", str(book)]) == 0
    assert main(["ledger", "price", "set", "--gpu-type", "a100", "--rate", "1.60", "--partition", "preempt",
                 "--multiplier", "0.4"]) == 0
    assert main(["ledger", "account", "add", "research"]) == 0
    assert main(["ledger", "user", "add", "alice", "--account", "research", "--default"]) == 0
    # Slurm cannot mirror the QOS multiplier (0.5 for low): no money quota beside it (issue 34)
    assert main(["quota", "set", "research", "--gpu-hours", "100", "--money", "500", "--period", "month"]) == 2
    assert "QOS multipliers other than 1 exist (low)" in capsys.readouterr().err
    assert main(["ledger", "price", "set", "--qos", "low", "--multiplier", "1"]) == 0
    assert main(["quota", "set", "research", "--gpu-hours", "100", "--money", "500", "--period", "month"]) == 0
    capsys.readouterr()
    assert main(["ledger", "price", "list", "--json"]) == 0
    prices = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in prices} >= {"h100", "3g.40gb", "a100", "gpu", "preempt", "low"}
    assert main(["quota", "show", "research", "--json"]) == 0
    (q,) = json.loads(capsys.readouterr().out)
    assert q["money_budget"] == "500.000000" and q["gpu_hours_budget"] == "100.000000"
    assert main(["quota", "show"]) == 0
    capsys.readouterr()
    assert main(["report", "cost", "--by", "gpu-type", "--period", "week", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    out_html = tmp_path / "r.html"
    assert main(["report", "cost", "--html", str(out_html)]) == 0
    assert out_html.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", "cost", "--csv"]) == 0
    assert capsys.readouterr().out.startswith("period_start,account,")


def test_bad_input_exits_2(cli_db, capsys):
    assert main(["db", "upgrade"]) == 0
    assert main(["quota", "set", "nosuch", "--gpu-hours", "1"]) == 1       # well-formed, missing: exit 1
    assert main(["quota", "set", "x"]) == 2
    assert main(["ledger", "price", "set", "--gpu-type", "h100", "--rate", "-3"]) == 2
    assert main(["ledger", "price", "set", "--gpu-type", "h100", "--of", "x", "--fraction", "seven"]) == 2
    assert main(["report", "cost", "--by", "moon"]) == 2
    assert main(["ledger", "account", "add", "bad name;rm"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
