"""Pure pieces of the engine: sacct rows -> trial runs, limits, best, array sizes."""
from __future__ import annotations

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs.spec import JobSpec, array_size, sbatch_options
from gpuhpc.slurm.commands import SACCT_FIELDS, SEP
from gpuhpc.slurm.parsers import parse_sacct, parse_submit_limits
from gpuhpc.sweeps.metrics import read_metrics
from gpuhpc.sweeps.refresh import runs_by_task
from gpuhpc.sweeps.store import best


def _row(job_id, state, elapsed="10", tres="cpu=1,gres/gpu=1"):
    d = dict.fromkeys(SACCT_FIELDS, "")
    d.update(JobID=job_id, JobIDRaw=job_id.split("_")[0], State=state, ElapsedRaw=elapsed, AllocTRES=tres)
    return SEP.join(d[f] for f in SACCT_FIELDS)


def test_runs_by_task_with_requeues_and_pending_ranges():
    text = "\n".join([
        _row("100_0", "PREEMPTED"), _row("100_0", "REQUEUED"), _row("100_0", "COMPLETED"),
        _row("100_1", "RUNNING"), _row("100_[2-4,7%2]", "PENDING"), _row("101_[0-50]", "CANCELLED by 0"),
    ])
    runs, ranges = runs_by_task(parse_sacct(text))
    assert [r.state.state.value for r in runs[("100", 0)]] == ["PREEMPTED", "REQUEUED", "COMPLETED"]
    assert len(runs[("100", 1)]) == 1
    assert sorted(t for (j, t) in ranges if j == "100") == [2, 3, 4, 7]
    assert ranges[("101", 50)].state.state.value == "CANCELLED"


ASSOC_MGR = """Current Association Manager state

Association Records

ClusterName=local Account=research UserName= Partition= Priority=0 ID=3
    GrpJobs=N(0) GrpJobsAccrue=N(0)
    GrpSubmitJobs=N(7) GrpWall=N(0.00)
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs= MaxWallPJ=
ClusterName=local Account=research UserName=alice(1000) Partition= Priority=0 ID=4
    GrpJobs=N(0) GrpJobsAccrue=N(0)
    GrpSubmitJobs=N(5) GrpWall=N(0.00)
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs=300(5) MaxWallPJ=
ClusterName=local Account=other UserName=alice(1000) Partition= Priority=0 ID=5
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs=10(0) MaxWallPJ=

QOS Records

QOS=normal(1)
    MaxJobsPU=N(0) MaxJobsAccruePU=N(0) MaxSubmitJobsPU=120(5)
QOS=low(2)
    MaxJobsPU=N(0) MaxJobsAccruePU=N(0) MaxSubmitJobsPU=2(0)
"""


def test_submit_limits_from_the_association_manager():
    cfg = {"MaxArraySize": "51", "MaxJobCount": "10000"}
    lim = parse_submit_limits(cfg, ASSOC_MGR, user="alice", account="research")
    assert (lim.max_array_size, lim.max_job_count, lim.max_submit_jobs, lim.submitted) == (51, 10000, 120, 5)
    assert parse_submit_limits(cfg, ASSOC_MGR, user="alice", account="other").max_submit_jobs == 10
    assert parse_submit_limits(cfg, ASSOC_MGR, user="alice", account="research", qos="low").max_submit_jobs == 2
    assert parse_submit_limits(cfg, ASSOC_MGR, user="bob").max_submit_jobs == 120     # the QOS's, per user
    assert parse_submit_limits(cfg, ASSOC_MGR.split("QOS Records")[0], user="bob").max_submit_jobs is None
    assert parse_submit_limits({}).max_array_size == 1001


def test_best_respects_goal_and_ties():
    rows = [dict(trial=0, state="completed", objective=2.0), dict(trial=1, state="completed", objective=1.0),
            dict(trial=2, state="failed", objective=0.0), dict(trial=3, state="completed", objective=1.0)]
    assert best(rows, "minimize")["trial"] == 1
    assert best(rows, "maximize")["trial"] == 0
    assert best([], "minimize") is None


def test_metrics_file_last_value_and_torn_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"step": 1, "metrics": {"loss": 3.0}}\n{"step": 2, "metrics": {"loss": 2.5, "acc": 0.5}}\n{"st')
    assert read_metrics(f) == {"loss": 2.5, "acc": 0.5, "step": 2}
    assert read_metrics(tmp_path / "none") is None


@pytest.mark.parametrize("text, n", [("0-9%2", 10), ("1,4-6", 4), ("0-10:5", 3), ("7", 1), ("0-50%16", 51)])
def test_array_size(text, n):
    assert array_size(text) == n


@pytest.mark.parametrize("text", ["", "a-b", "5-1", "0-3%0", "1000-", "0-3;id"])
def test_bad_arrays(text):
    with pytest.raises(UserInputError):
        array_size(text)


def test_jobspec_array_reaches_sbatch():
    spec = JobSpec(command=("true",), array="0-4%2")
    assert ("array", "0-4%2") in sbatch_options(spec.resources, spec)
    assert spec.array_size == 5 and JobSpec(command=("true",)).array_size == 1
