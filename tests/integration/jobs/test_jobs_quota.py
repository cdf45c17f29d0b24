"""The submit path calls the ledger's reservation hook before sbatch: over quota -> exit 3
and nothing submitted; within quota -> held, submitted, the hold attached to the job."""
from __future__ import annotations

import json

import pytest

from jobs_helpers import gpuhpc, research_quota

pytestmark = pytest.mark.integration


def test_quota_is_reserved_before_sbatch(jobs_env, slurm, track, monkeypatch):
    research_quota(monkeypatch, gpu_hours=1)
    big = gpuhpc("submit", "-p", "gpu", "--gpus", "8", "--gpu-type", "h100", "--nodes", "2", "--template", "torchrun", "-t", "2h",
                 "-A", "research", "--hold", "--name", "gpuhpc-test-quota-big", "--", "true")
    assert big.returncode == 3, big.stderr
    assert big.stderr.startswith("error: quota exceeded") and "32.00" in big.stderr and big.stdout == ""
    assert not [r for r in slurm.queue(user="root") if r.name == "gpuhpc-test-quota-big"]
    small = gpuhpc("submit", "-p", "gpu", "--gpus", "1", "--gpu-type", "h100", "-t", "15m", "-A", "research",
                   "--hold", "--name", "gpuhpc-test-quota-small", "--json", "--", "true")
    assert small.returncode == 0, small.stderr
    track(json.loads(small.stdout)["job_id"])
    shown = json.loads(gpuhpc("quota", "show", "--json").stdout)
    row = next(q for q in shown if q["account"] == "research" and q["user"] is None)
    assert float(row["held_gpu_hours"]) == pytest.approx(0.25)
