"""What a new user hits with the job commands, on the real cluster: cancel of a job that does
not exist, GPU requests no node can hold, ``logs -f`` following a growing log, ``status``."""
from __future__ import annotations

import json
import re
import uuid

import pytest
from jobs_helpers import gpuhpc

pytestmark = pytest.mark.integration

NO_SUCH_JOB = "67000000"        # below Slurm's MaxJobId (67043328), far above what tests reach


def _name() -> str:
    return f"gpuhpc-test-cli-{uuid.uuid4().hex[:8]}"


def _held(track, name: str) -> str:
    res = gpuhpc("submit", "--partition", "cpu", "--time", "5m", "--hold", "--name", name, "--", "true")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    track(job_id)
    return job_id


@pytest.fixture
def sbatch_calls(jobs_env, tmp_path, monkeypatch):
    """A recording ``sbatch`` first on PATH (tests/recording.py) for this test's ``gpuhpc``
    commands; returns ``calls()``, each call's argv."""
    import os

    from recording import record_calls

    calls = record_calls(tmp_path / "bin", "sbatch")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return calls


def _sbatch_sees_a_submission(track, calls) -> None:
    """A held job submitted the same way is one more call: the recording sbatch is on the path the
    refused submissions took (were gpuhpc to run sbatch from elsewhere, "no call" would prove nothing)."""
    before = len(calls())
    job_id = _held(track, _name())
    after = calls()
    assert len(after) == before + 1 and "--parsable" in after[-1], (job_id, after)


def test_cancel_of_a_job_that_does_not_exist_fails(jobs_env):
    res = gpuhpc("cancel", NO_SUCH_JOB)
    assert res.returncode == 1
    assert res.stdout == "" and f"job {NO_SUCH_JOB}: no such job" in res.stderr


def test_cancel_then_cancel_again(jobs_env, slurm, track):
    job_id = _held(track, _name())
    res = gpuhpc("cancel", job_id)
    assert res.returncode == 0 and res.stdout == f"cancelled {job_id}\n", res.stderr
    res = gpuhpc("cancel", job_id, NO_SUCH_JOB, "--json")
    assert res.returncode == 1
    out = {r["job_id"]: r for r in json.loads(res.stdout)}
    assert out[job_id]["cancelled"] is False and "already ended (CANCELLED" in out[job_id]["error"]
    assert out[NO_SUCH_JOB]["error"] == "no such job"


def _scontrol_gpus(slurm) -> dict[str, dict[str, int]]:
    """node -> {gpu type: count}, read from ``scontrol show node``'s Gres= here in the test."""
    out = slurm.run(["scontrol", "show", "node", "--oneliner"]).stdout
    nodes = {}
    for line in out.splitlines():
        name = re.search(r"NodeName=(\S+)", line).group(1)
        gres = re.search(r"\bGres=(\S+)", line).group(1)
        nodes[name] = {m.group(1): int(m.group(2)) for m in re.finditer(r"gpu:([^:,()]+):(\d+)", gres)}
    return nodes


def test_unknown_gpu_type_is_refused_before_sbatch(jobs_env, slurm, sbatch_calls, track):
    name = _name()
    res = gpuhpc("submit", "--gpu-type", "nosuch", "--gpus", "1", "--name", name, "--", "true")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    types = sorted({t for gpus in _scontrol_gpus(slurm).values() for t in gpus})
    assert "'nosuch'" in res.stderr and f"it has: {', '.join(types)}" in res.stderr
    assert sbatch_calls() == []          # sbatch never saw it
    _sbatch_sees_a_submission(track, sbatch_calls)


def test_more_gpus_than_the_largest_node_is_refused(jobs_env, slurm, sbatch_calls, track):
    name = _name()
    res = gpuhpc("submit", "--gpus", "100000", "--name", name, "--", "true")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    largest = max(sum(g.values()) for g in _scontrol_gpus(slurm).values())
    assert "100000 GPUs per node" in res.stderr and f"has {largest} " in res.stderr
    res = gpuhpc("submit", "--gpus", "9", "--gpu-type", "h100", "--partition", "gpu", "--name", name, "--", "true")
    assert res.returncode == 2 and "largest node of partition gpu" in res.stderr and "has 8" in res.stderr
    assert sbatch_calls() == []          # sbatch never saw either
    _sbatch_sees_a_submission(track, sbatch_calls)


def test_logs_follow_prints_each_line_once_and_ends_with_the_job(jobs_env, track):
    res = gpuhpc("submit", "--partition", "cpu", "--time", "5m", "--name", _name(), "--",
                 "bash", "-c", "for i in $(seq 1 12); do echo line $i; sleep 0.3; done")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    track(job_id)
    follow = gpuhpc("logs", "-f", job_id, timeout=180)
    assert follow.returncode == 0, follow.stderr
    lines = [ln for ln in follow.stdout.splitlines() if ln.startswith("line ")]
    assert lines == [f"line {i}" for i in range(1, 13)]
    # what -f printed is the whole log, once
    assert gpuhpc("logs", job_id).stdout == follow.stdout


def test_status_of_a_held_job(jobs_env, track):
    job_id = _held(track, _name())
    res = gpuhpc("status", job_id, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["job_id"] == job_id and info["state"] == "PENDING" and info["finished"] is False
    assert info["restarts"] == 0 and info["log"].endswith(f"-{job_id}.out")
    res = gpuhpc("status", NO_SUCH_JOB)
    assert res.returncode == 1 and "not found" in res.stderr
