"""gpuhpc.report() with a NaN or an infinity (a diverging run) never raises: raising on the rank
that reports while its peers wait in the next collective would hang the job. The value is kept
as a failed value (``"failed": {"loss": "nan"}``), in strict JSON, never among ``metrics``,
in the sweep trial's file and in the job's metrics file alike."""
from __future__ import annotations

import json
import warnings

import pytest

from gpuhpc.ledger.metrics import report


def _strict(line: str) -> dict:
    """json.loads that refuses NaN/Infinity tokens (not JSON: PostgreSQL's json, jq, ... refuse them)."""
    def bad(token: str):
        raise ValueError(f"non-JSON token {token}")
    return json.loads(line, parse_constant=bad)


@pytest.fixture
def files(tmp_path, monkeypatch):
    trial = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("GPUHPC_METRICS_FILE", str(trial))
    monkeypatch.setenv("GPUHPC_METRICS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c1")
    for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    return trial, tmp_path / "jobs" / "c1" / "77.jsonl"


@pytest.mark.parametrize("bad,text", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_a_non_finite_value_is_recorded_as_failed_without_raising(files, bad, text):
    trial, job = files
    report(step=3, loss=0.5)
    with pytest.warns(RuntimeWarning, match="recorded as failed"):
        report(step=4, loss=bad, samples_per_s=10.0)
    for path in (trial, job):
        lines = [_strict(x) for x in path.read_text().splitlines()]
        assert lines[0]["metrics"] == {"loss": 0.5} and "failed" not in lines[0]
        assert lines[1]["metrics"] == {"samples_per_s": 10.0}        # the finite one is kept
        assert lines[1]["failed"] == {"loss": text}
    assert _strict(trial.read_text().splitlines()[1])["step"] == 4


def test_only_failed_values_still_write_a_line(files):
    trial, _ = files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report(step=9, loss=float("nan"))
    rec = _strict(trial.read_text())
    assert rec["metrics"] == {} and rec["failed"] == {"loss": "nan"} and rec["step"] == 9


def test_other_bad_input_still_raises(files):
    with pytest.raises(ValueError):
        report(step=1, loss="abc")
    with pytest.raises(ValueError):
        report(step=-1, loss=1.0)
