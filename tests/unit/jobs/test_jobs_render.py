"""Rendered sbatch scripts: valid bash, quoting that survives bash, the launcher lines."""
from __future__ import annotations

import subprocess

import pytest

from gpuhpc.cli import submit as cli_submit
from gpuhpc.jobs.render import render, sbatch_quote
from gpuhpc.jobs.spec import JobSpec, Resources

HOSTILE = ["$(touch /tmp/pwned2)", "`id`", "a'b\"c", "ünï ✓;|&", "--", "$HOME", "\\", ""]


def _bash_array(script: str, var: str = "_gpuhpc_cmd") -> list[str]:
    line = next(line for line in script.splitlines() if line.startswith(f"{var}=("))
    out = subprocess.run(["bash", "-c", line + f'\nprintf "%s\\0" "${{{var}[@]}}"'],
                         capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


@pytest.mark.parametrize("template", ["single", "torchrun", "deepspeed", "mpi"])
def test_every_template_is_valid_bash(template, tmp_path):
    spec = JobSpec(command=("python", "train.py", *HOSTILE), template=template, name="x; touch /tmp/pwned",
                   resources=Resources(nodes=1 if template == "single" else 2, gpus=8, gpu_type="h100", time="2h"), env={"V": "$(x) 'y'"})
    text = render(spec)
    path = tmp_path / "job.sh"
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert text.startswith("#!/bin/bash\n#SBATCH --job-name=\"x; touch /tmp/pwned\"\n")
    assert "GPUHPC_CHECKPOINT_DIR" in text and "scontrol requeue" in text and "trap _gpuhpc_on_usr2 USR2" in text
    assert _bash_array(text) == ["python", "train.py", *HOSTILE]       # torchrun keeps the interpreter


def test_env_values_are_literal():
    spec = JobSpec(command=("true",), env={"EVIL": "$(touch /tmp/x); `y` 'q' \"d\" ü"})
    line = next(line for line in render(spec).splitlines() if line.startswith("export EVIL="))
    out = subprocess.run(["bash", "-c", line + '\nprintf %s "$EVIL"'], capture_output=True, text=True).stdout
    assert out == "$(touch /tmp/x); `y` 'q' \"d\" ü"


def test_sbatch_quote_uses_sbatch_syntax():
    assert sbatch_quote("gpu:h100:8") == "gpu:h100:8"
    assert sbatch_quote("x; touch /tmp/pwned") == '"x; touch /tmp/pwned"'
    assert sbatch_quote('a"b\\c') == '"a\\"b\\\\c"'


def test_torchrun_launcher_line():
    text = render(JobSpec(command=("python3", "train.py", "--lr", "3e-4"), template="torchrun",
                          resources=Resources(nodes=2, gpus=8, gpu_type="h100")))
    assert '${GPUHPC_TORCHRUN:-torchrun}' in text
    for part in ('--nnodes="$SLURM_JOB_NUM_NODES"', '--nproc_per_node="$GPUHPC_NPROC_PER_NODE"',
                 '--node_rank="$SLURM_NODEID"', '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"',
                 "--rdzv_backend=static", "export GPUHPC_NPROC_PER_NODE=8",
                 "scontrol show hostnames", "NodeAddr="):
        assert part in text
    assert "srun --nodes=\"$SLURM_JOB_NUM_NODES\" --ntasks-per-node=1" in text
    assert '--max_restarts=0 --no_python "$@"' in text             # python3 train.py runs as given
    text = render(JobSpec(command=("train.py",), template="torchrun", resources=Resources(nodes=2, gpus=8)))
    assert '--max_restarts=0 "$@"' in text


def test_mpi_picks_pmix_or_pmi2():
    text = render(JobSpec(command=("./a.out",), template="mpi", resources=Resources(nodes=2, gpus=4)))
    assert "srun --mpi=list" in text and "pmix" in text and "pmi2" in text
    assert "#SBATCH --ntasks-per-node=4" in text
    forced = render(JobSpec(command=("./a.out",), template="mpi", mpi="pmi2"))
    assert "_gpuhpc_mpi=pmi2" in forced


def test_cli_dry_run_prints_and_submits_nothing(capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("sbatch must not run on --dry-run")

    monkeypatch.setattr("gpuhpc.jobs.script_mode.submit_spec", boom)
    rc = cli_submit.run(["--gpus", "8", "--gpu-type", "h100", "--nodes", "2", "--time", "2h", "--template", "torchrun",
                         "--partition", "gpu", "--account", "proj-x", "--dry-run", "--",
                         "python", "train.py", "--lr", "3e-4"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "#SBATCH --gres=gpu:h100:8\n" in out and "#SBATCH --nodes=2\n" in out
    assert "#SBATCH --account=proj-x\n" in out and "#SBATCH --time=02:00:00\n" in out
    assert _bash_array(out) == ["python", "train.py", "--lr", "3e-4"]


def test_cli_mig_dry_run(capsys):
    assert cli_submit.run(["--gpus", "1", "--gpu-type", "1g.10gb", "-p", "mig", "--dry-run", "--", "x"]) == 0
    assert "#SBATCH --gres=gpu:1g.10gb:1\n" in capsys.readouterr().out


def test_yaml_job_file_and_flags_override(tmp_path, capsys):
    f = tmp_path / "job.yaml"
    f.write_text("name: from-file\ngpus: 4\ngpu_type: h100\ntime: 3h\npartition: gpu\n"
                 "env: {A: '1'}\ncommand: [python, train.py]\ntemplate: torchrun\nnodes: 2\n")
    assert cli_submit.run(["-f", str(f), "--gpus", "8", "--env", "B=2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --gres=gpu:h100:8\n" in out and "#SBATCH --time=03:00:00\n" in out
    assert "#SBATCH --job-name=from-file\n" in out and "export A=1\n" in out and "export B=2\n" in out
    assert "torchrun" in out


def test_cli_errors_are_user_input_errors(tmp_path):
    from gpuhpc.errors import UserInputError

    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: 1\nbogus: 2\ncommand: [x]\n")
    for argv in (["--bogus"], ["--gpus", "x", "--", "a"], ["--dry-run"], ["-f", str(bad), "--dry-run"],
                 ["-f", str(tmp_path / "missing.yaml")], ["--env", "NOEQUALS", "--", "a"]):
        with pytest.raises(UserInputError):
            cli_submit.run(argv)


def test_all_templates_listed():
    from gpuhpc.jobs.render import template_dir

    assert {p.name for p in template_dir().glob("*.sbatch.j2")} >= {
        "single.sbatch.j2", "torchrun.sbatch.j2", "deepspeed.sbatch.j2", "mpi.sbatch.j2"}


@pytest.mark.parametrize("template", ["single", "torchrun", "deepspeed", "mpi"])
def test_cached_skeleton_equals_direct_jinja_render(template, tmp_path, monkeypatch):
    from gpuhpc.jobs.render import context, render_jinja

    monkeypatch.setenv("GPUHPC_CACHE_DIR", str(tmp_path / "cache"))
    for spec in (
        JobSpec(command=("python", "t.py", *HOSTILE), template=template, name="x; touch /tmp/pwned",
                resources=Resources(nodes=1 if template == "single" else 2, gpus=8, gpu_type="h100"), env={"V": "$(x) 'y'", "W": "\\"}),
        JobSpec(command=("a",), template=template, checkpoint_dir="/ck/%j", grace=5, mpi="pmi2",
                requeue=False),
    ):
        first = render(spec)                               # builds the cache
        assert list((tmp_path / "cache" / "templates").iterdir())
        assert render(spec) == first == render_jinja(template, context(spec))
        assert "\x00" not in first
