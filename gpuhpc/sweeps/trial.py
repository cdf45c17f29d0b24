"""What each array task of a sweep runs: ``python -m gpuhpc.sweeps.trial SWEEP_DIR CHUNK``.

It reads line ``$SLURM_ARRAY_TASK_ID`` of ``SWEEP_DIR/chunks/CHUNK.jsonl`` (its trial and
parameters), points the checkpoint contract at the trial's own directory (a preempted trial,
or one resubmitted by ``sweep resume``, finds its checkpoint again) and replaces itself with
the trial: ``bash -c`` of the command with every value shell-quoted (command sweeps), or the
pickled callable (Python sweeps). Environment: ``GPUHPC_SWEEP_ID``, ``GPUHPC_TRIAL_ID``,
``GPUHPC_RUN_ID`` (:func:`run_id`: the same in every run of the trial), ``GPUHPC_PARAMS_JSON``, ``GPUHPC_TRIAL_DIR``, ``GPUHPC_METRICS_FILE`` (where
:func:`gpuhpc.report` appends), ``GPUHPC_CHECKPOINT_DIR``, ``GPUHPC_LATEST_CHECKPOINT``.

Early stopping: the sweep driver prunes a trial by writing ``pruned`` in its directory
(:data:`PRUNED`, :func:`should_prune`) and a stop request in the stop directory of the job
that runs it (the checkpoint path's ``$GPUHPC_STOP_DIR``, which each run records in
:data:`STOP_DIR`), so :func:`gpuhpc.should_stop` and ``gpuhpc_should_stop`` say stop as well.
A pruned trial that starts again (a requeue) exits at once.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: in a trial's directory: the pruner's decision (JSON: step, why, time), written by the driver
PRUNED = "pruned"
#: in a trial's directory: ``$GPUHPC_STOP_DIR`` of the run now running it (where the driver asks it to stop)
STOP_DIR = "stop_dir"


def run_id(sweep_id: object, number: int) -> str:
    """A trial's ``GPUHPC_RUN_ID``: its sweep and trial number, whichever array, requeue or
    ``sweep resume`` runs it (an experiment tracker resumes one run, not one per job)."""
    return f"sweep{sweep_id}-trial{number}"


def should_prune() -> bool:
    """True once the sweep's pruner has stopped this trial (``pruner:`` in the sweep file):
    leave the training loop and exit; the trial ends ``pruned`` and is never resumed. Cheap
    (one file test): call it after each :func:`gpuhpc.report`. False outside a sweep trial."""
    tdir = os.environ.get("GPUHPC_TRIAL_DIR")
    return bool(tdir) and os.path.exists(os.path.join(tdir, PRUNED))


def trial_env(sweep_dir: Path, chunk: int, task: int) -> tuple[dict, dict[str, str], dict]:
    """(the chunk line, the environment to add, sweep.json) of array task ``task``."""
    with open(sweep_dir / "chunks" / f"{chunk}.jsonl", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i == task:
                entry = json.loads(line)
                break
        else:
            raise SystemExit(f"gpuhpc: chunk {chunk} has no task {task}")
    meta = json.loads((sweep_dir / "sweep.json").read_text())
    number = int(entry["trial"])
    tdir = sweep_dir / "trials" / str(number)
    ckpt = tdir / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    from gpuhpc.jobs.checkpoint import latest_checkpoint

    latest = latest_checkpoint(ckpt)
    env = {"GPUHPC_SWEEP_ID": str(meta["sweep_id"]), "GPUHPC_TRIAL_ID": str(number),
           # the same whichever array, requeue or resume runs the trial (experiment trackers)
           "GPUHPC_RUN_ID": run_id(meta["sweep_id"], number),
           "GPUHPC_PARAMS_JSON": json.dumps(entry["params"], sort_keys=True), "GPUHPC_TRIAL_DIR": str(tdir),
           "GPUHPC_METRICS_FILE": str(tdir / "metrics.jsonl"), "GPUHPC_CHECKPOINT_DIR": str(ckpt),
           "GPUHPC_LATEST_CHECKPOINT": str(latest) if latest else ""}
    return entry, env, meta


def run_python(sweep_dir: Path, params: dict, metric: str) -> int:
    """A Python sweep's trial: ``fn(**params)``; a number it returns is reported as the metric
    (a dict: each number in it), and the result is kept in ``result.pkl``.

    A :class:`~gpuhpc.jobs.checkpoint.Checkpointable` ``fn`` is snapshotted (its ``checkpoint``
    hook, then the pickled object, to ``state.pkl`` in the trial's directory) on SIGUSR2 or
    SIGTERM, and the job template requeues the task; the next run calls the restored object."""
    import signal

    import cloudpickle

    from gpuhpc.fsutil import write_atomic
    from gpuhpc.jobs.checkpoint import Checkpointable, restart_count
    from gpuhpc.ledger.metrics import report

    tdir = Path(os.environ["GPUHPC_TRIAL_DIR"])
    state = tdir / "state.pkl"
    fn = cloudpickle.loads((state if state.exists() else sweep_dir / "fn.pkl").read_bytes())
    if isinstance(fn, Checkpointable):
        fn.restarts = restart_count()

        def on_signal(signum, frame):  # noqa: ARG001
            if fn.checkpoint(**params) is not False:
                write_atomic(state, cloudpickle.dumps(fn), fsync=True)
                sys.stderr.write(f"gpuhpc: signal {signum}: trial state saved\n")
            raise SystemExit(0 if signum == signal.SIGUSR2 else 143)

        signal.signal(signal.SIGUSR2, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    result = fn(**params)
    write_atomic(tdir / "result.pkl", cloudpickle.dumps(result))
    if isinstance(result, bool):
        pass
    elif isinstance(result, (int, float)):
        report(**{metric: float(result)})
    elif isinstance(result, dict):
        nums = {k: float(v) for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                and str(k).isidentifier()}
        if nums:
            report(**nums)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m gpuhpc.sweeps.trial SWEEP_DIR CHUNK\n")
        return 2
    sweep_dir, chunk = Path(args[0]), int(args[1])
    task = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
    entry, env, meta = trial_env(sweep_dir, chunk, task)
    os.environ.update(env)
    if meta.get("kind") == "python" and meta.get("container"):
        if not os.environ.get("GPUHPC_TRIAL_IN_IMAGE"):     # this same module, by the image's python3, there
            from gpuhpc.containers.cache import step_argv

            os.environ["GPUHPC_TRIAL_IN_IMAGE"] = "1"
            argv = step_argv(meta["container"], ["python3", "-m", "gpuhpc.sweeps.trial", *args])
            os.execvp(argv[0], argv)
        if meta.get("python") != "%d.%d" % sys.version_info[:2]:
            sys.stderr.write(f"gpuhpc: the image's python3 is {sys.version.split()[0]}; the sweep's function was "
                             f"pickled by Python {meta.get('python')} (docs/containers.md)\n")
            return 1
    job = os.environ.get("SLURM_JOB_ID")
    if job:         # which job ran this trial (its log is logs/*-<job>.out): sweep status shows the tail
        fd = os.open(os.path.join(env["GPUHPC_TRIAL_DIR"], "jobs"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{job}\n".encode())
        finally:
            os.close(fd)
    stop_dir = os.environ.get("GPUHPC_STOP_DIR")
    if stop_dir:        # where the driver's stop request for this run goes (then the pruned mark is read)
        from gpuhpc.fsutil import write_atomic

        write_atomic(Path(env["GPUHPC_TRIAL_DIR"]) / STOP_DIR, stop_dir + "\n")
    if should_prune():
        sys.stderr.write(f"gpuhpc: sweep {meta['sweep_id']} trial {entry['trial']} was pruned: not run again\n")
        return 0
    sys.stderr.write(f"gpuhpc: sweep {meta['sweep_id']} trial {entry['trial']} (chunk {chunk} task {task}); "
                     f"params {env['GPUHPC_PARAMS_JSON']}; checkpoints in {env['GPUHPC_CHECKPOINT_DIR']} "
                     f"(latest {env['GPUHPC_LATEST_CHECKPOINT'] or 'none'})\n")
    sys.stderr.flush()
    if meta.get("kind") == "python":
        return run_python(sweep_dir, entry["params"], meta["metric"])
    from gpuhpc.sweeps.spec import render_command

    command = render_command(meta["command"], entry["params"])
    if meta.get("container"):          # in the sweep's image (its sh): one srun step (docs/containers.md)
        from gpuhpc.containers.cache import step_argv

        argv = step_argv(meta["container"], ["sh", "-c", command])
        os.execvp(argv[0], argv)
    os.execvp("bash", ["bash", "-c", command])
    return 127      # not reached


if __name__ == "__main__":
    sys.exit(main())
