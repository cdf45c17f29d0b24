"""A sprint trial's throughput is read from its metrics file (issue 33.9): the toy's warm-up
report (a fifth of its throughput) is left out, the median of the rest is the model's, and the
spread is kept; a trial with one report keeps that value."""
from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from gpuhpc.sprints.run import records
from gpuhpc.sprints.spec import from_mapping

REPO = Path(__file__).resolve().parents[3]
TOY = REPO / "examples" / "sprints" / "toy_train.py"
sys.path.insert(0, str(TOY.parent))


def run_toy(metrics: Path, batch: int, reports: int) -> None:
    metrics.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(GPUHPC_METRICS_FILE=str(metrics), PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, str(TOY), "--batch-size", str(batch), "--seconds", "0", "--reports",
                    str(reports)], env=env, check=True, capture_output=True, timeout=60)


def test_records_leave_the_warm_up_out_and_keep_the_spread(tmp_path):
    from toy_train import model

    spec = from_mapping({"name": "t", "command": "toy --batch-size {batch_size}", "axes": {"batch_size": [64, 256]},
                         "warmup": 1})
    run_toy(tmp_path / "trials" / "0" / "metrics.jsonl", 64, 4)
    run_toy(tmp_path / "trials" / "1" / "metrics.jsonl", 256, 1)
    rows = [{"trial": n, "params": {"batch_size": b}, "state": "completed", "metrics": {"samples_per_s": 1.0}}
            for n, b in ((0, 64), (1, 256))]
    four, one = records(spec, rows, Decimal("2.50"), utilisation=False, directory=str(tmp_path))
    thr = model(64, 1, 1)[0]
    assert four.throughput == pytest.approx(thr) and four.reports == 3
    assert four.spread == (pytest.approx(0.98 * thr), pytest.approx(1.02 * thr))
    assert one.throughput == pytest.approx(model(256, 1, 1)[0]) and one.spread is None and one.reports == 0
    # without the sweep's directory: the last value the trial reported (the database's)
    assert records(spec, rows, None, utilisation=False)[0].throughput == 1.0
