"""Issue 33.8 on the local cluster: ``gpuhpc logs JOB -f --rank N`` follows one rank of a
two-rank job through a requeue until the job ends, and ``notify:`` sends Slurm's mail options and
one webhook POST per job (end, failure, requeue cap) to a real HTTP server in this test, from the
notifier (``python -m gpuhpc.jobs.notify``) outside the jobs."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from jobs_helpers import gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

# each rank: a line per run; the first run waits to be requeued, the second says goodbye and ends
RANK_PROGRAM = ('echo "hello from rank $RANK run $GPUHPC_RESTART_COUNT"; '
                'if [ "$GPUHPC_RESTART_COUNT" = 0 ]; then touch "$1/started.$RANK"; while :; do sleep 0.2; done; fi; '
                'echo "bye from rank $RANK"')


def _submit(*args: str) -> str:
    res = gpuhpc("submit", "--time", "10m", "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]


def test_logs_follow_one_rank_through_a_requeue(jobs_env, tmp_path, slurm, track):
    job_id = _submit("--template", "deepspeed", "--partition", "gpu", "--gpus", "2", "--gpu-type", "h100",
                     "--name", "gpuhpc-test-rank-logs", "--", "bash", "-c", RANK_PROGRAM, "prog", str(tmp_path))
    track(job_id)
    wait_for(lambda: all((tmp_path / f"started.{r}").exists() for r in (0, 1)), 120, f"both ranks of job {job_id}")
    follower = subprocess.Popen([sys.executable, "-m", "gpuhpc", "logs", job_id, "-f", "--rank", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: "hello from rank 0 run 0" in (gpuhpc("logs", job_id, "--rank", "0").stdout or ""), 60,
                 f"rank 0's first line in job {job_id}'s log")
        slurm.requeue(job_id)
        wait_for(lambda: job_state(slurm, job_id) in ENDED, 120, f"job {job_id}'s second run to end")
        out, err = follower.communicate(timeout=60)        # -f ends by itself once the job has
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    text = out.decode()
    assert job_state(slurm, job_id) == "COMPLETED", text
    assert text.count("hello from rank 1 run 0\n") == 1 and text.count("hello from rank 1 run 1\n") == 1, text
    assert text.index("run 0") < text.index(f"job {job_id} restart 1") < text.index("run 1") < text.index("bye from rank 1")
    assert "rank 0" not in text and not re.search(r"(?m)^ *\d+: ", text), text     # only rank 1, label removed
    whole = gpuhpc("logs", job_id).stdout
    assert "0: hello from rank 0 run 1" in whole and "1: bye from rank 1" in whole, whole
    zero = gpuhpc("logs", job_id, "--rank", "0", "--json")
    assert json.loads(zero.stdout)["text"].count("hello from rank 0") == 2 and "rank 1" not in zero.stdout
    for bad, words in (("2", "past the job's 2 task"), ("-1", "is not a rank"), ("one", "is not a rank")):
        res = gpuhpc("logs", job_id, "--rank", bad)
        assert res.returncode == 2 and res.stderr.startswith("error: --rank: ") and words in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_notify_webhooks_on_end_failure_and_requeue_cap(jobs_env, tmp_path, slurm, track, hook):
    url = f"http://127.0.0.1:{hook.server_port}"
    ends = _submit("--partition", "cpu", "--name", "gpuhpc-test-notify-end", "--notify", f"webhook={url}/ends",
                   "--", "true")
    fails = _submit("--partition", "cpu", "--name", "gpuhpc-test-notify-fail", "--notify", f"webhook={url}/fails",
                    "--notify", "mail=gpuhpc-test@example.org", "--notify", "events=fail,requeue_cap", "--", "bash", "-c", "exit 3")
    capped = _submit("--partition", "cpu", "--name", "gpuhpc-test-notify-cap", "--max-requeues", "0",
                     "--notify", f"webhook={url}/capped", "--", "bash", "-c",
                     'trap "exit 0" USR2; touch "$1"; while :; do sleep 0.2; done', "prog", str(tmp_path / "capped"))
    for j in (ends, fails, capped):
        track(j)
    rec = slurm.show_job(fails)
    assert rec["MailUser"] == "gpuhpc-test@example.org" and rec["MailType"] == "FAIL", rec
    wait_for(lambda: (tmp_path / "capped").exists(), 90, f"job {capped} to start")
    slurm.run(["scancel", "--signal=USR2", "--batch", capped])     # the warning, and --max-requeues 0

    def notified():
        res = subprocess.run([sys.executable, "-m", "gpuhpc.jobs.notify"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return len(hook.got) == 3

    wait_for(notified, 120, lambda: f"three webhooks (got {sorted(hook.got)}; jobs "
                                    f"{[job_state(slurm, j) for j in (ends, fails, capped)]})")
    got = hook.got
    assert (got["/ends"]["event"], got["/ends"]["job_id"], got["/ends"]["state"]) == ("end", ends, "COMPLETED")
    assert (got["/fails"]["event"], got["/fails"]["state"], got["/fails"]["exit_code"]) == ("fail", "FAILED", "3:0")
    assert (got["/capped"]["event"], got["/capped"]["exit_code"]) == ("requeue_cap", "75:0"), got["/capped"]
    assert "requeue cap reached" in got["/capped"]["message"]
    assert sorted(p.name for p in (jobs_env / "notify").iterdir()) == []     # every registration done
    hook.got.clear()                                      # sent once: a later run sends nothing
    assert subprocess.run([sys.executable, "-m", "gpuhpc.jobs.notify"], timeout=60).returncode == 0
    assert hook.got == {}


def test_bad_notify_is_refused_before_sbatch(jobs_env, track):
    for args, field in ((["--notify", "webhook=file:///etc/passwd"], "notify.webhook[0]"),
                        (["--notify", "events=begin", "--notify", "mail=root"], "notify.events[0]"),
                        (["--notify", "mail=root;id"], "notify.mail")):
        res = gpuhpc("submit", "--partition", "cpu", "--time", "5m", *args, "--", "true")
        if res.stdout.strip().isdigit():
            track(res.stdout.strip())                 # submitted after all: cancelled at the end
        assert res.returncode == 2 and res.stdout == "", (res.stdout, res.stderr)
        assert res.stderr.startswith(f"error: {field}: ") and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_python_call_notify_reaches_sbatch(jobs_env, slurm, track):
    """``gpuhpc.submit(fn, notify=...)`` (Python mode, through submitit): Slurm holds the mail
    options of the job file's ``notify.mail`` and the webhook is registered for the notifier."""
    import gpuhpc

    job = gpuhpc.submit(abs, -1, resources=gpuhpc.Resources(partition="cpu", time="5m"), name="gpuhpc-test-notify-py",
                        notify={"mail": "gpuhpc-test@example.org", "events": ["fail", "requeue_cap"],
                                "webhook": "http://127.0.0.1:9/never"})
    track(job.job_id)
    rec = slurm.show_job(job.job_id)
    assert rec["MailUser"] == "gpuhpc-test@example.org" and rec["MailType"] == "FAIL", rec
    reg = json.loads((jobs_env / "notify" / f"{job.job_id}.json").read_text())
    assert reg["webhooks"] == ["http://127.0.0.1:9/never"] and reg["events"] == ["fail", "requeue_cap"]
