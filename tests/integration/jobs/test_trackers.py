"""Experiment trackers across a requeue (issue 33.2), offline, with the real packages: a job that
follows docs/jobs.md's recipe ("Experiment trackers") logs a metric to W&B in offline mode
(``wandb.init(id=$GPUHPC_RUN_ID, resume="allow")``), to an MLflow file store (the run found by its
``gpuhpc_run_id`` tag) and to TensorBoard (tensorboardX: one log directory per run,
``purge_step`` at the resumed step); the preemption warning (SIGUSR2, as
``preempt_send_user_signal`` sends at a preemption) stops its first run and the job script
requeues it; the second run resumes from the checkpoint and logs again. Afterwards each tracker
holds ONE run, named by the job's id: not one per requeue.

This file is also the job's program (``python test_trackers.py OUT``, below ``main``)."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROJECT, METRIC = "gpuhpc-test-trackers", "loss"
STEPS = 6                # over both runs; the first checkpoints at step 3 and logs step 3 once more


# ---------------------------------------------------------------- the job's program
def main(out: Path) -> None:
    run_id, restart = os.environ["GPUHPC_RUN_ID"], int(os.environ["GPUHPC_RESTART_COUNT"])
    # everything the trackers write stays in OUT; nothing asks the network
    os.environ.update({"WANDB_MODE": "offline", "WANDB_DIR": str(out), "WANDB_CONFIG_DIR": str(out / "wandb-config"),
                       "WANDB_CACHE_DIR": str(out / "wandb-cache"), "WANDB_DATA_DIR": str(out / "wandb-data"),
                       "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false",
                       "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"})
    stop = []
    signal.signal(signal.SIGUSR2, lambda *_: stop.append(1))       # the preemption warning
    ckpt = out / "checkpoint.json"
    start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0

    import mlflow
    import wandb
    from tensorboardX import SummaryWriter

    run = wandb.init(project=PROJECT, id=run_id, resume="allow")
    mlflow.set_tracking_uri(f"file:{out / 'mlruns'}")
    found = mlflow.search_runs(filter_string=f"tags.gpuhpc_run_id = '{run_id}'", output_format="list")
    mlflow.start_run(run_id=found[0].info.run_id) if found else mlflow.start_run(tags={"gpuhpc_run_id": run_id})
    writer = SummaryWriter(log_dir=str(out / "runs" / run_id), purge_step=start or None)

    def log(step: int) -> None:
        value = 1.0 / (step + 1)
        run.log({METRIC: value}, step=step)
        mlflow.log_metric(METRIC, value, step=step)
        writer.add_scalar(METRIC, value, step)

    if restart == 0:
        for step in range(3):
            log(step)
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": 3}))
        tmp.replace(ckpt)
        log(3)                                   # after the checkpoint: lost at the preemption, logged again
        (out / "ready").touch()
        while not stop:
            signal.pause()
    else:
        for step in range(start, STEPS):
            log(step)
    writer.close()
    mlflow.end_run()
    run.finish()
    with open(out / "runs.log", "a") as f:
        f.write(f"{restart} {run_id} {start}\n")


# ---------------------------------------------------------------- the test
def _tb_events(path: Path) -> list:
    """The events of one TensorBoard event file (TFRecord framing: length, its CRC, the record,
    its CRC), as tensorboardX's Event messages."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    data, events, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        events.append(Event.FromString(data[i + 12:i + 12 + n]))
        i += 12 + n + 4
    return events


def test_trackers_show_one_run_across_a_requeue(jobs_env, tmp_path, slurm, track, monkeypatch):
    from jobs_helpers import gpuhpc, job_state
    from polling import wait_for

    out = tmp_path / "out"
    out.mkdir()
    res = gpuhpc("submit", "--partition", "cpu", "--time", "10m", "--grace", "30", "--max-requeues", "2",
                 "--name", "gpuhpc-test-trackers", "--json", "--", sys.executable, __file__, str(out))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: (out / "ready").exists(), 120, f"job {job_id}'s first run to log and checkpoint")
    slurm.run(["scancel", "--signal=USR2", "--batch", job_id])        # the warning a preemption sends
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 180,
             f"job {job_id} to be requeued, run again and end")
    from gpuhpc.jobs.api import Job

    assert job_state(slurm, job_id) == "COMPLETED", Job(job_id, client=slurm).logs()[-3000:]
    assert slurm.restarts(job_id) == 1

    # W&B offline: a directory per run of the job (offline-run-<time>-<id>), all with the one id
    offline = sorted((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 2, offline
    assert {d.name.split("-", 3)[3] for d in offline} == {job_id}           # offline-run-<date_time>-<id>
    assert all((d / f"run-{job_id}.wandb").stat().st_size > 0 for d in offline)

    # MLflow file store: one run, tagged with the job's id, with both runs' steps (step 3 twice:
    # the first run's after its checkpoint, the second's)
    for var in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"):   # as the job: no network
        monkeypatch.setenv(var, "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{out / 'mlruns'}")
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(found) == 1 and found[0].data.tags["gpuhpc_run_id"] == job_id, found
    history = client.get_metric_history(found[0].info.run_id, METRIC)
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 3, 4, 5]

    # TensorBoard: one log directory, the run's id; the second run's file starts by purging the
    # first run's steps from 3 on, then logs 3..5
    assert [d.name for d in (out / "runs").iterdir()] == [job_id]
    files = sorted((out / "runs" / job_id).glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
    assert len(files) == 2, files
    first, second = (_tb_events(f) for f in files)
    assert [e.step for e in first if e.HasField("summary")] == [0, 1, 2, 3]
    purge = [e for e in second if e.HasField("session_log")]
    assert purge and purge[0].step == 3 and purge[0].session_log.status == purge[0].session_log.START
    assert [e.step for e in second if e.HasField("summary")] == [3, 4, 5]
    runs = [line.split() for line in (out / "runs.log").read_text().splitlines()]
    assert runs == [["0", job_id, "0"], ["1", job_id, "3"]]            # one GPUHPC_RUN_ID, resumed at step 3


if __name__ == "__main__":
    main(Path(sys.argv[1]))
