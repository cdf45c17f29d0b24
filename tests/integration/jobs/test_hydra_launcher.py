"""``hydra/launcher=gpuhpc`` runs a real Hydra app's multirun on the cluster (issue 33.7): three
values of ``x`` go out as one gpuhpc job array on the shared cluster's cpu partition; each job
writes its override (hydra_app.py) and the launcher hands Hydra three COMPLETED JobReturns, in the
order of the overrides, with each job's return value, its Slurm array task as ``hydra.job.id``
and Hydra's sweep layout (``<sweep dir>/<num>/.hydra/overrides.yaml``). Each job runs a second."""
from __future__ import annotations

import subprocess
import sys
import threading

from hydra.core.utils import JobStatus

from jobs_helpers import HERE
from polling import wait_for

sys.path.insert(0, str(HERE))
import hydra_app  # noqa: E402


def test_a_hydra_multirun_runs_as_one_job_array(jobs_env, tmp_path, hydra_sweep_runner, hydra_restore_singletons,
                                                  monkeypatch, track):
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{sys.path[0]}")      # the task function, on the node
    out, sweep_dir = tmp_path / "out", tmp_path / "sweep"
    out.mkdir()
    sweep = hydra_sweep_runner(
        calling_file=hydra_app.__file__, calling_module=None, task_function=hydra_app.task, config_path=None,
        config_name="hydra_app", temp_dir=sweep_dir,
        overrides=["hydra/launcher=gpuhpc", "hydra.launcher.partition=cpu", "hydra.launcher.time=5m",
                   "hydra.launcher.name=gpuhpc-test-hydra", f"out={out}", "x=1,2,3"])
    with sweep:
        assert sweep.returns is not None and len(sweep.returns) == 1
        returns = sweep.returns[0]
        ids = [r.hydra_cfg.hydra.job.id for r in returns]
        for job_id in ids:
            track(job_id)
        assert [r.status for r in returns] == [JobStatus.COMPLETED] * 3
        assert [r.return_value for r in returns] == [10, 20, 30]
        assert [r.overrides for r in returns] == [[f"out={out}", f"x={x}"] for x in (1, 2, 3)]
        array = {i.split("_")[0] for i in ids}
        assert len(array) == 1 and sorted(i.split("_")[1] for i in ids) == ["0", "1", "2"], ids   # one array
        for num, x in enumerate((1, 2, 3)):
            assert (out / f"x-{x}.txt").read_text().split() == [str(x), str(num), ids[num], ids[num].split("_")[0]]
            assert (sweep_dir / str(num) / ".hydra" / "overrides.yaml").read_text().split() == ["-", f"out={out}",
                                                                                             "-", f"x={x}"]


def test_a_preempted_hydra_job_is_requeued_and_its_task_runs_again(jobs_env, tmp_path, hydra_sweep_runner,
                                                                   hydra_restore_singletons, monkeypatch, track):
    """Issue 33.7's checkpoint-requeue: of a multirun of two, the job of x=2 gets the preemption
    warning while its task runs (SIGUSR2 to its steps, as Slurm's --signal sends it before a time
    limit or a preemption); it is requeued and its task function runs again (restart 1), and Hydra
    gets both jobs COMPLETED with their returns."""
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{sys.path[0]}")
    out, sweep_dir = tmp_path / "out", tmp_path / "sweep"
    out.mkdir()
    signalled: list[str] = []

    def preempt() -> None:                    # beside the launcher, which waits for the jobs
        runs = out / "x-2.runs"
        wait_for(runs.exists, 180, "x=2's first run to start")
        job = next(line.split()[0] for line in subprocess.run(
            ["squeue", "--noheader", "--name", "gpuhpc-test-hydra-requeue", "--format", "%i %T"],
            capture_output=True, text=True, timeout=60).stdout.splitlines() if line.split()[0].endswith("_1"))
        signalled.append(job)
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=60)

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    sweep = hydra_sweep_runner(
        calling_file=hydra_app.__file__, calling_module=None, task_function=hydra_app.task, config_path=None,
        config_name="hydra_app", temp_dir=sweep_dir,
        overrides=["hydra/launcher=gpuhpc", "hydra.launcher.partition=cpu", "hydra.launcher.time=10m",
                   "hydra.launcher.grace=10", "hydra.launcher.name=gpuhpc-test-hydra-requeue", f"out={out}",
                   "slow=2", "x=1,2"])
    with sweep:
        thread.join(timeout=5)
        returns = sweep.returns[0]
        for r in returns:
            track(r.hydra_cfg.hydra.job.id)
        assert [r.status for r in returns] == [JobStatus.COMPLETED] * 2, [r.status for r in returns]
        assert [r.return_value for r in returns] == [10, 20]
        assert signalled and (out / "x-2.runs").read_text().split() == ["0", "1"]      # requeued once, ran again
