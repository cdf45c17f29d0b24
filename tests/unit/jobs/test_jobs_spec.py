"""JobSpec/Resources validation and THE translation to sbatch options."""
from __future__ import annotations

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs.spec import (JobSpec, Resources, format_slurm_time, parse_duration,
                              sbatch_options, tasks_per_node)


@pytest.mark.parametrize("text,seconds", [
    ("2h", 7200), ("90m", 5400), ("45s", 45), ("1d", 86400), ("1h30m", 5400), ("120", 7200),
    (30, 1800), ("02:00:00", 7200), ("10:30", 630), ("1-00:00:00", 86400), ("2-12", 216000),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "2 hours", "h", "-5m", "0", "1h\n", True])
def test_parse_duration_rejects(bad):
    with pytest.raises(UserInputError):
        parse_duration(bad)


def test_format_slurm_time_rounds_up_to_minutes():
    assert format_slurm_time(7200) == "02:00:00"
    assert format_slurm_time(61) == "00:02:00"
    assert format_slurm_time(86400 + 3600) == "1-01:00:00"


def _opts(**kw):
    spec = JobSpec(command=("python", "train.py"), **kw)
    return dict(sbatch_options(spec.resources, spec))


def test_issue_example_translation():
    r = Resources(gpus=8, gpu_type="h100", nodes=2, time="2h", partition="gpu", account="proj-x")
    o = _opts(resources=r, template="torchrun")
    assert o["gres"] == "gpu:h100:8"           # --gpus is per node
    assert o["nodes"] == "2" and o["ntasks-per-node"] == "1"
    assert o["time"] == "02:00:00" and o["partition"] == "gpu" and o["account"] == "proj-x"
    assert o["signal"] == "B:USR2@60" and "requeue" in o and o["requeue"] is None
    assert o["open-mode"] == "append"
    assert o["output"].endswith("/gpuhpc-%j.out")
    assert r.total_gpus == 16


def test_mig_profile_is_a_gpu_type():
    o = _opts(resources=Resources(gpus=1, gpu_type="1g.10gb", partition="mig"))
    assert o["gres"] == "gpu:1g.10gb:1"


def test_untyped_gpus_and_options():
    o = _opts(resources=Resources(gpus=2, mem="64g", cpus_per_task=4, exclusive=True, qos="high",
                                  constraint="h100&ib", nodelist="gpu-node[1-2]"),
              hold=True, dependency="afterok:12", workdir="/w", grace=120, requeue=True)
    assert o["gres"] == "gpu:2" and o["mem"] == "64G" and o["cpus-per-task"] == "4"
    assert o["exclusive"] is None and o["hold"] is None and o["dependency"] == "afterok:12"
    assert o["chdir"] == "/w" and o["signal"] == "B:USR2@120"
    assert o["constraint"] == "h100&ib" and o["nodelist"] == "gpu-node[1-2]"


def test_no_requeue():
    o = _opts(requeue=False)
    assert "no-requeue" in o and "requeue" not in o and "signal" not in o


def test_tasks_per_node_by_template():
    r = Resources(gpus=4)
    assert tasks_per_node(JobSpec(command=("a",), resources=r)) == 1
    assert tasks_per_node(JobSpec(command=("a",), resources=r, template="torchrun")) == 1
    assert tasks_per_node(JobSpec(command=("a",), resources=r, template="mpi")) == 4
    assert tasks_per_node(JobSpec(command=("a",), resources=r, template="deepspeed")) == 4


def test_python_mode_options_have_no_job_fields():
    o = dict(sbatch_options(Resources(gpus=1, time="20m"), None, batch_signal=False))
    assert set(o) == {"nodes", "gres", "time"}


@pytest.mark.parametrize("kwargs,field", [
    ({"nodes": 0}, "resources.nodes"),
    ({"gpus": -1}, "resources.gpus"),
    ({"gpu_type": "h100"}, "resources.gpus"),
    ({"gpus": 1, "gpu_type": "h100;rm"}, "resources.gpu_type"),
    ({"partition": "gpu part"}, "resources.partition"),
    ({"account": "a\nb"}, "resources.account"),
    ({"mem": "lots"}, "resources.mem"),
    ({"time": "forever"}, "resources.time"),
    ({"nodelist": "$(x)"}, "resources.nodelist"),
])
def test_resources_rejects(kwargs, field):
    with pytest.raises(UserInputError) as exc:
        Resources(**kwargs)
    assert exc.value.field == field and exc.value.exit_code == 2


def test_unknown_resource_lists_valid_ones():
    with pytest.raises(UserInputError) as exc:
        Resources.from_mapping({"gpus": 1, "gpu_count": 2})
    assert "gpu_count" in str(exc.value) and "gpu_type" in exc.value.hint and "nodes" in exc.value.hint


@pytest.mark.parametrize("kwargs,field", [
    ({"name": "a\nb"}, "name"),
    ({"name": ""}, "name"),
    ({"env": {"A": "x\ny"}}, "env.A"),
    ({"env": {"A B": "x"}}, "env.A B"),
    ({"env": {"1A": "x"}}, "env.1A"),
    ({"template": "slurm"}, "template"),
    ({"grace": "2h"}, "grace"),
    ({"max_requeues": -1}, "max_requeues"),
    ({"dependency": "afterok:1;rm"}, "dependency"),
    ({"mpi": "openmpi"}, "mpi"),
])
def test_jobspec_rejects(kwargs, field):
    with pytest.raises(UserInputError) as exc:
        JobSpec(command=("true",), **kwargs)
    assert exc.value.field == field


def test_command_must_be_argv_without_control_chars():
    with pytest.raises(UserInputError):
        JobSpec(command="python train.py")
    with pytest.raises(UserInputError):
        JobSpec(command=())
    with pytest.raises(UserInputError) as exc:
        JobSpec(command=("echo", "a\tb"))
    assert exc.value.field == "command[1]"
    # everything else (quotes, $(), unicode) is accepted and quoted later
    JobSpec(command=("echo", "$(x)", "`y`", "'\"", "ünï ✓"), name="x; touch /tmp/pwned",
            env={"V": "$(z); 'q'"})


def test_grace_bare_number_is_seconds():
    assert JobSpec(command=("a",), grace="90").grace_s == 90
    assert JobSpec(command=("a",), grace="2m").grace_s == 120


def test_from_mapping_top_level_and_nested_resources():
    s = JobSpec.from_mapping({"command": ["python", "t.py"], "gpus": 8, "gpu_type": "h100",
                              "nodes": 2, "name": "n", "env": {"A": 1}, "template": "torchrun"})
    assert s.resources.gpus == 8 and s.resources.nodes == 2 and s.env == {"A": "1"}
    s = JobSpec.from_mapping({"command": ["t"], "resources": {"gpus": 1, "time": "3h"}})
    assert s.resources.time_s == 3 * 3600
    with pytest.raises(UserInputError) as exc:
        JobSpec.from_mapping({"command": ["t"], "gpuz": 1})
    assert "valid:" in exc.value.one_line() and "gpu_type" in exc.value.one_line()


def test_output_path_uses_a_safe_name(tmp_path):
    s = JobSpec(command=("a",), name="x; touch /tmp/pwned %j", log_dir=str(tmp_path / "l%s"))
    assert s.output_path == str(tmp_path / "l%%s" / "x_touch_tmp_pwned_j-%j.out")


def test_single_template_on_several_nodes_is_an_error():
    with pytest.raises(UserInputError) as exc:
        JobSpec(command=("a",), resources=Resources(nodes=2))
    assert exc.value.field == "template" and "torchrun" in exc.value.one_line()
    assert JobSpec(command=("a",), template="mpi", resources=Resources(nodes=2)).resources.nodes == 2
