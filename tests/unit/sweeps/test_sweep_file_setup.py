"""Sweep files take a job file's environment setup (issue 33.3: ``setup:``, ``modules:``, ``conda:``
or ``venv:``) and pass-through options (33.4: ``sbatch_args:``, into ``resources.extra``), checked as a
job file's are: bad input names the field (exit 2). Every trial's job gets them (the chunk's JobSpec),
also when the driver rebuilds the spec from the database (its JSON)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps.planner import trial_spec
from gpuhpc.sweeps.spec import SweepSpec, spec_from_json, spec_json

BASE = {"name": "s", "command": "echo {x}", "parameters": {"x": {"values": [1, 2]}}, "metric": {"name": "loss"},
        "method": "grid", "resources": {"partition": "gpu"}}


def test_setup_modules_venv_and_sbatch_args_reach_every_trials_job(tmp_path: Path):
    spec = SweepSpec.from_mapping({**BASE, "setup": ["export A=1"], "modules": ["cuda/12.4"], "venv": "~/envs/t",
                                   "sbatch_args": ["--reservation=maint"]})
    again = spec_from_json(spec_json(spec))          # the driver's copy
    assert again == spec
    job = trial_spec(again, 3, tmp_path, 0, 2, 2)
    assert job.setup == ("export A=1",) and job.modules == ("cuda/12.4",) and job.venv == "~/envs/t"
    assert job.resources.extra == ("--reservation=maint",)
    lines = job.setup_lines
    assert lines[-3:] == ["module load cuda/12.4", '. "$HOME"/envs/t/bin/activate', "export A=1"]


@pytest.mark.parametrize("extra, field", [
    ({"setup": ["a\nb"]}, "setup[0]"),
    ({"modules": ["x; rm -rf /"]}, "modules[0]"),
    ({"conda": "a", "venv": "b"}, "venv"),
    ({"venv": "{{ evil }}"}, "venv"),
    ({"sbatch_args": ["--partition=x"]}, "sbatch_args[0]"),
])
def test_bad_setup_or_sbatch_args_are_refused_naming_the_field(extra, field):
    with pytest.raises(UserInputError) as err:
        SweepSpec.from_mapping({**BASE, **extra})
    assert err.value.field == field
