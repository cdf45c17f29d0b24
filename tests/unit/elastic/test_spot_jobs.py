"""Jobs on spot capacity get checkpoint-requeue by default (issue 24), whichever way they are
submitted: a reclaim sets the node DOWN and Slurm requeues only a requeueable job, so the rendered
sbatch (gpuhpc submit, a JobSpec through the Python API, a sweep's trial array) carries
``--requeue``, the warning signal to the batch shell, an appending log and the resume path
(GPUHPC_LATEST_CHECKPOINT, the template's own ``scontrol requeue`` after a checkpoint); a Python
callable gets ``--requeue`` from submitit's parameters. Opting out is explicit: ``--no-requeue``
(``requeue: false`` in a job file, ``JobSpec(requeue=False)``, ``gpuhpc.submit(fn,
requeue=False)``). The cluster side: a spec whose spot partitions have ``runtime.job_requeue``
false is refused (test_elastic_conf.py), so even a bare ``sbatch`` job requeues on a reclaim.
The same sbatch runs through a real reclaim in the scenario
test_a_spot_reclaim_requeues_the_job_which_resumes_from_its_checkpoint_until_its_restart_budget."""
from __future__ import annotations

import pathlib

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs import api
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from gpuhpc.jobs.submitit_adapters import submitit_params
from gpuhpc.sweeps import planner
from gpuhpc.sweeps.spec import SweepSpec

SPOT = Resources(partition="spot", time="1h")


def _sbatch(text: str) -> list[str]:
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_a_job_on_spot_is_requeueable_with_the_warning_signal_and_the_resume_path_by_default():
    text = render(JobSpec(command=("python", "train.py"), resources=SPOT, name="spot-train"))
    opts = _sbatch(text)
    assert "--partition=spot" in opts and "--requeue" in opts and "--no-requeue" not in opts
    assert "--signal=B:USR2@60" in opts and "--open-mode=append" in opts
    assert 'export GPUHPC_LATEST_CHECKPOINT="$(_gpuhpc_latest)"' in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text and "trap _gpuhpc_on_usr2 USR2" in text


def test_a_spot_job_opts_out_explicitly():
    for spec in (JobSpec(command=("x",), resources=SPOT, requeue=False),
                 JobSpec.from_mapping({"command": ["x"], "partition": "spot", "time": "1h", "requeue": False})):
        opts = _sbatch(render(spec))
        assert "--no-requeue" in opts and "--requeue" not in opts
        assert not any(o.startswith("--signal") for o in opts)


def test_a_python_callable_on_spot_is_requeueable_unless_it_opts_out():
    params = submitit_params(SPOT, "f", 60, None)
    assert params["additional_parameters"]["requeue"] is True and params["signal_delay_s"] == 60
    off = submitit_params(SPOT, "f", 60, None, requeue=False)["additional_parameters"]
    assert off["no_requeue"] is True and "requeue" not in off
    with pytest.raises(UserInputError) as exc:
        api.submit(print, resources=SPOT, requeue="no", client=object())
    assert exc.value.field == "requeue"


def test_a_sweep_trial_array_on_spot_is_requeueable():
    spec = SweepSpec.from_mapping({"name": "s", "command": "run --lr {lr}", "method": "grid",
                                   "metric": {"name": "loss"}, "parameters": {"lr": [1, 2]},
                                   "resources": {"partition": "spot", "time": "1h"}})
    job = planner.trial_spec(spec, 1, pathlib.Path("/x"), 0, 2, 2)
    opts = _sbatch(render(job))
    assert job.requeue and "--requeue" in opts and "--partition=spot" in opts and "--array=0-1%2" in opts
