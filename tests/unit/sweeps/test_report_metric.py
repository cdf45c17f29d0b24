"""gpuhpc.report(step=...) and `gpuhpc report-metric` append to a sweep trial's metrics file."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuhpc.cli.main import main
from gpuhpc.ledger.metrics import report


@pytest.fixture
def trial_env(tmp_path, monkeypatch):
    f = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("GPUHPC_METRICS_FILE", str(f))
    monkeypatch.setenv("GPUHPC_TRIAL_ID", "3")
    monkeypatch.setenv("GPUHPC_METRICS_DIR", str(tmp_path / "jobs"))
    for k in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    return f


def test_report_appends_step_and_metrics(trial_env):
    report(step=1, loss=0.5)
    report(loss=0.25, acc=0.9)
    lines = [json.loads(x) for x in trial_env.read_text().splitlines()]
    assert [(x["step"], x["metrics"]) for x in lines] == [(1, {"loss": 0.5}), (None, {"loss": 0.25, "acc": 0.9})]
    assert lines[0]["trial"] == "3"


@pytest.mark.parametrize("kwargs", [dict(step=-1, loss=1.0), dict(step=1.5, loss=1.0)])   # NaN: test_report_nonfinite.py
def test_report_rejects_bad_values(trial_env, kwargs):
    with pytest.raises(ValueError):
        report(**kwargs)
    assert not trial_env.exists()


def test_report_metric_command(trial_env, capsys):
    assert main(["report-metric", "loss", "0.125", "--step", "7"]) == 0
    rec = json.loads(trial_env.read_text())
    assert rec["step"] == 7 and rec["metrics"] == {"loss": 0.125}
    assert main(["report-metric", "my loss", "1"]) == 2
    assert main(["report-metric", "loss", "abc"]) == 2
    assert main(["report-metric", "loss", "inf"]) == 2
    assert "error:" in capsys.readouterr().err


def test_concurrent_appends_never_interleave(trial_env):
    code = ("import gpuhpc\n"
            "for i in range(200): gpuhpc.report(step=i, loss=float(i), padding=1.0)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy()) for _ in range(4)]
    assert all(p.wait() == 0 for p in procs)
    lines = trial_env.read_text().splitlines()
    assert len(lines) == 800 and all(json.loads(x)["metrics"]["padding"] == 1.0 for x in lines)
