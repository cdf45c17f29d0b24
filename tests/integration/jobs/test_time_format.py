"""A user's SLURM_TIME_FORMAT=relative (in their shell; in the job's environment too, here with
--env: gpuhpc's own sbatch runs with `standard`) breaks no time gpuhpc reads: the job template still reads the job's EndTime at the warning signal (as
`relative`, a 9-day job's EndTime is "11 21:24" and `date` takes it for 11:00 today, in the past,
so the deadline was the --grace fallback instead of the limit), and SlurmClient's sacct and
scontrol times stay ISO 8601 ("21:24:43" as `relative`). On the shared cluster's cpu partition;
the job runs seconds."""
from __future__ import annotations

import datetime as dt
import json
import re

from jobs_helpers import gpuhpc, job_state
from polling import wait_for


def test_relative_time_format_breaks_neither_the_deadline_nor_parsing(jobs_env, tmp_path, slurm, track,
                                                                       monkeypatch):
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    ready = tmp_path / "ready"
    res = gpuhpc("submit", "--partition", "cpu", "--time", "9-00:00:00", "--grace", "60", "--max-requeues", "0",
                 "--env", "SLURM_TIME_FORMAT=relative", "--name", "gpuhpc-test-time-format", "--json", "--", "bash", "-c",
                 'trap "exit 0" USR2; echo "$SLURM_TIME_FORMAT" > "$1"; while :; do sleep 0.1; done', "prog", str(ready))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: ready.exists() and ready.read_text().strip(), 60, f"job {job_id} to start")
    assert ready.read_text().strip() == "relative"          # the job has the user's format too

    rec = slurm.show_job(job_id)
    end = dt.datetime.fromisoformat(rec["EndTime"])           # ISO 8601 through SlurmClient
    (row,) = [r for r in slurm.accounting(job_ids=[job_id]) if r.job_id == job_id]
    start = dt.datetime.fromisoformat(row.start)
    assert abs((dt.datetime.now() - start).total_seconds()) < 300, row.start
    assert (end - start).total_seconds() == 9 * 86400

    slurm.run(["scancel", "--signal=USR2", "--batch", job_id])
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED"), 60, f"job {job_id} to end")
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    m = re.search(r"deadline (\d\d:\d\d:\d\d) \((\d+)s\)", log)
    assert m, log[-2000:]
    # the deadline is the job's EndTime (days away), not now + the 60 s grace
    assert int(m.group(2)) > 8 * 86400 and m.group(1) == end.strftime("%H:%M:%S"), (m.group(0), rec["EndTime"])
