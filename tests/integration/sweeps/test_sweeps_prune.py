"""Early stopping on the local cluster (partition ``cpu``, CPU-only trials).

A 40-trial grid at parallelism 8 whose trials report ``loss`` once a step for 10 steps (0.7 s
apart; 2.5 s for the bad ones, so that one the pruner failed to stop would run to its end whatever
the load, and the test see it): the good half (trials 0-19, first in the grid: the median pruner, as Optuna's, compares a trial with
*completed* ones, so some must complete first) improves, the bad half (20-39) is clearly worse.
With ``pruner: {type: median, warmup_steps: 2, min_trials: 4}`` every bad trial is pruned after
its first reports (``gpuhpc.should_prune()`` in some trials, the checkpoint path's
``gpuhpc.should_stop(step)``, which reads the same stop file a preemption writes, in others, and
those that never ask have their task cancelled after the pruner's ``grace``), ends ``pruned``
(not failed, whether Slurm says COMPLETED or CANCELLED), is run
once and never resumed; every good trial completes. The trial-steps saved against running every
trial to the end are printed on stderr.

``fail_fast: 3`` on a sweep whose trials all fail: the sweep stops ``failed`` (its message says
why) after 3 failures, and the trials not yet submitted never are."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from polling import wait_for
from sweeps_helpers import PY, gpuhpc, results, run_sweep, write_sweep

pytestmark = pytest.mark.integration

CPU = {"partition": "cpu", "time": "10m"}
STEPS = 10

TRIAL = """\
import sys, time
import gpuhpc
bad, seed = int(sys.argv[1]), int(sys.argv[2])
for step in range({steps}):
    loss = (2.0 - 0.01 * step) if bad else (1.0 - 0.05 * step - 0.001 * seed)
    gpuhpc.report(step=step, loss=loss)
    if bad and seed % 4 == 3:       # deaf: never asks (the driver cancels its task after the grace)
        pass
    # even seeds ask should_prune(); odd ones only the preemption path's should_stop (its stop file)
    elif (gpuhpc.should_prune() if seed % 2 == 0 else gpuhpc.should_stop(step)):
        print(f"stopped after step {{step}}", flush=True)
        sys.exit(0)
    time.sleep(2.5 if bad else 0.7)     # a bad trial that is not stopped runs 25 s: far longer than a driver round
if bad and seed % 4 == 3:
    time.sleep(300)
"""
DEAF = {20 + seed for seed in range(20) if seed % 4 == 3}        # bad trials that never look


def test_median_pruner_stops_the_bad_half_which_ends_pruned_and_never_resumes(sweep_env, sweeps, tmp_path):
    from gpuhpc.sweeps import store

    script = tmp_path / "trial.py"
    script.write_text(TRIAL.format(steps=STEPS))
    f = write_sweep(tmp_path / "prune.yaml", name="t-prune", method="grid",
                    command=f"{PY} {script} {{bad}} {{seed}}",
                    parameters={"bad": {"values": [0, 1]}, "seed": {"type": "int", "low": 0, "high": 19}},
                    parallelism=8, resources=CPU, metric={"name": "loss", "goal": "minimize"},
                    pruner={"type": "median", "warmup_steps": 2, "min_trials": 4, "grace": 10})
    sid = run_sweep(f)
    sweeps(sid)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "240", "--poll", "1", timeout=260)
    assert res.returncode == 0, (res.stdout, res.stderr)     # pruned trials are no failure
    rows = results(sid)
    info = store.sweep_info(sid)
    directory = Path(info["directory"])
    by = {r["trial"]: r for r in store.trial_rows(sid)}
    good = [r for r in rows if r["params"]["bad"] == 0]
    bad = [r for r in rows if r["params"]["bad"] == 1]
    assert len(good) == len(bad) == 20
    assert all(r["state"] == "completed" for r in good), [(r["trial"], r["state"]) for r in good]
    assert all(r["state"] == "pruned" for r in bad), [(r["trial"], r["state"]) for r in bad]
    steps_run = {}
    for r in rows:
        lines = (directory / "trials" / str(r["trial"]) / "metrics.jsonl").read_text().splitlines()
        steps_run[r["trial"]] = len(lines)
        assert by[r["trial"]]["attempts"] == 1 and r["restarts"] == 0, r      # run once, never resumed
    for r in bad:
        mark = json.loads((directory / "trials" / str(r["trial"]) / "pruned").read_text())
        assert "median" in mark["why"], (r["trial"], mark)
        if r["trial"] in DEAF:          # its task cancelled by the driver once the grace had passed
            assert by[r["trial"]]["raw_state"].startswith("CANCELLED"), by[r["trial"]]
        else:                           # it left its loop itself
            assert steps_run[r["trial"]] < STEPS and by[r["trial"]]["raw_state"].startswith("COMPLETED"), \
                (r["trial"], mark, steps_run[r["trial"]], by[r["trial"]]["raw_state"])
    assert all(steps_run[r["trial"]] == STEPS for r in good)
    assert info["status"] == "done"
    # never resumed: a resume resubmits nothing, and every pruned trial stays pruned
    res = gpuhpc("sweep", "resume", str(sid), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["resubmitted"] == [], res.stderr
    assert [r["trial"] for r in store.trial_rows(sid) if r["state"] == "pruned"] == [r["trial"] for r in bad]
    st = gpuhpc("sweep", "status", str(sid), "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["pruned"] == 20, st.stdout
    html = tmp_path / "r.html"
    assert gpuhpc("sweep", "report", str(sid), "--html", str(html)).returncode == 0
    assert "Pruned trials (20)" in html.read_text()
    total = len(rows) * STEPS
    ran = sum(steps_run.values())
    sys.stderr.write(f"\nmedian pruner, 40 trials x {STEPS} steps: {ran} trial-steps run, {total - ran} of {total} "
                     f"saved ({100 * (total - ran) / total:.0f}%); pruned trials ran "
                     f"{sorted(steps_run[r['trial']] for r in bad)} steps\n")


def test_fail_fast_stops_the_sweep_after_n_failures_and_submits_no_more(sweep_env, sweeps, tmp_path):
    from gpuhpc.sweeps import store

    f = write_sweep(tmp_path / "ff.yaml", name="t-failfast", method="grid", command="echo trial {x}; exit 3",
                    parameters={"x": {"type": "int", "low": 0, "high": 19}}, parallelism=2, chunk_size=2,
                    resources=CPU, metric={"name": "loss"}, fail_fast=3)
    sid = run_sweep(f)
    sweeps(sid)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "120", "--poll", "1", timeout=140)
    assert res.returncode == 1 and "fail_fast" in res.stderr, (res.stdout, res.stderr)
    info = store.sweep_info(sid)
    assert info["status"] == "failed" and info["message"].startswith("fail_fast: "), info
    # status --watch ends too (the waiting trials wait for a resume), saying why
    st = gpuhpc("sweep", "status", str(sid), "--watch", "--interval", "1", timeout=60)
    assert st.returncode == 0 and "fail_fast" in st.stdout, (st.stdout, st.stderr)
    rows = store.trial_rows(sid)
    failed = [r for r in rows if r["state"] == "failed"]
    never = [r for r in rows if r["attempts"] == 0]
    assert len(failed) >= 3, [(r["trial"], r["state"]) for r in rows]
    sys.stderr.write(f"\nfail_fast 3, parallelism 2: {len(failed)} failed, {20 - len(never)} of 20 trials submitted\n")
    # at most parallelism trials beyond the third failure were out when it was seen
    assert len(never) >= 20 - 3 - 2 * 2 and all(r["state"] == "waiting" for r in never), \
        [(r["trial"], r["state"], r["attempts"]) for r in rows]
    jobs = [c["job_id"] for c in info["chunks"] if c["job_id"]] + [info["driver_job_id"]]
    from gpuhpc.slurm.client import SlurmClient

    wait_for(lambda: SlurmClient().active_job_ids(jobs) == set(), 60, "nothing of the sweep left in the queue")
    assert store.sweep_info(sid)["chunks"] == info["chunks"]     # the driver submitted nothing after


@pytest.mark.parametrize("change, field", [
    ({"pruner": {"type": "medain"}}, "pruner.type"),
    ({"pruner": {"type": "median", "warmup_steps": -1}}, "pruner.warmup_steps"),
    ({"pruner": {"type": "asha", "reduction_factor": 1}}, "pruner.reduction_factor"),
    ({"pruner": {"type": "hyperband", "max_resource": 9}}, "pruner.type"),        # without Optuna (below)
    ({"fail_fast": 0}, "fail_fast"),
])
def test_bad_pruner_or_fail_fast_exit_2_naming_the_field_and_submit_nothing(sweep_env, tmp_path, change, field):
    no_optuna = tmp_path / "no-optuna"          # `import optuna` fails, as where it is not installed
    (no_optuna / "optuna").mkdir(parents=True)
    (no_optuna / "optuna" / "__init__.py").write_text("raise ImportError('optuna is not installed')\n")
    f = write_sweep(tmp_path / "bad.yaml", name="t-badprune", command="echo {x}", method="grid",
                    parameters={"x": {"values": [1, 2]}}, resources=CPU, metric={"name": "loss"}, **change)
    res = gpuhpc("sweep", "run", str(f), env={"PYTHONPATH": str(no_optuna)})
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"error: {field}:") and len(res.stderr.strip().splitlines()) == 1, res.stderr
    if change.get("pruner", {}).get("type") == "hyperband":
        assert "pip install optuna" in res.stderr
    assert not (sweep_env / "sweeps").exists()      # nothing written, nothing submitted
