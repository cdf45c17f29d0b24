"""Environment setup (``setup``/``modules``/``conda``/``venv``) and sbatch pass-through options
(``sbatch_args``, ``--sbatch-arg``, ``Resources(extra=...)``): what is refused (exit 2, one line
naming the field, nothing submitted), how values are quoted, and the rendered templates run
under bash with stand-ins for srun, scontrol and torchrun: the lines run in every task, in order
(modules, then conda/venv, then setup lines), before the program. No Slurm needed; the real
cluster: tests/integration/jobs/test_jobs_setup.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.cli import submit as cli_submit
from gpuhpc.errors import UserInputError
from gpuhpc.jobs import api
from gpuhpc.jobs.submitit_adapters import submitit_params
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import (SBATCH_OWNED, SBATCH_PASS_THROUGH, JobSpec, Resources, container_srun_args,
                              sbatch_options)


def _cli(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """``gpuhpc submit ARGV`` in-process with sbatch replaced by a failure: returns (exit, out, err)."""
    from gpuhpc.cli.main import run_guarded
    from gpuhpc.slurm.client import SlurmClient

    def no_sbatch(*a, **k):
        raise AssertionError("sbatch was called")

    monkeypatch.setattr(SlurmClient, "submit_script", no_sbatch)
    rc = run_guarded(lambda: cli_submit.run(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("argv,field,words", [
    (["--setup", "echo {{ x }}"], "--setup[0]", "'{{' is not allowed"),
    (["--setup", "ok", "--setup", "a {% if %}"], "--setup[1]", "'{%' is not allowed"),
    (["--setup", "a\nb"], "--setup[0]", "control character"),
    (["--setup", "a\x00b"], "--setup[0]", "control character"),
    (["--module", "cuda 12"], "--module[0]", "not a valid module name"),
    (["--module", "x;id"], "--module[0]", "not a valid module name"),
    (["--module", "$(id)"], "--module[0]", "not a valid module name"),
    (["--conda", "a\tb"], "conda", "control character"),
    (["--venv", "/v/{{x}}"], "venv", "template syntax"),
    (["--conda", "e", "--venv", "/v"], "venv", "conda and venv both given"),
    (["--sbatch-arg=--gres=gpu:8"], "--sbatch-arg[0]", "--gres is gpuhpc's; use gpus/gpu_type"),
    (["--sbatch-arg=--gpus-per-task=1"], "--sbatch-arg[0]", "--gpus-per-task is gpuhpc's; use gpus/gpu_type"),
    (["--sbatch-arg=--partition=gpu-hi"], "--sbatch-arg[0]", "--partition is gpuhpc's; use partition"),
    (["--sbatch-arg=--account=root"], "--sbatch-arg[0]", "--account is gpuhpc's; use account"),
    (["--sbatch-arg=--time=9-00"], "--sbatch-arg[0]", "--time is gpuhpc's; use time"),
    (["--sbatch-arg=--container-image=x"], "--sbatch-arg[0]", "--container-image is gpuhpc's; use image"),
    (["--sbatch-arg=--part=gpu-hi"], "--sbatch-arg[0]", "--part is not an sbatch option gpuhpc passes through"),
    (["--sbatch-arg=-p gpu"], "--sbatch-arg[0]", "is not --long-option"),
    (["--sbatch-arg=reservation=x"], "--sbatch-arg[0]", "is not --long-option"),
    (["--sbatch-arg=--reservation x"], "--sbatch-arg[0]", "is not --long-option"),
    (["--sbatch-arg=--reservation"], "--sbatch-arg[0]", "--reservation needs a value"),
    (["--sbatch-arg=--contiguous=yes"], "--sbatch-arg[0]", "--contiguous takes no value"),
    (["--sbatch-arg=--comment=a\nb"], "--sbatch-arg[0]", "control character"),
])
def test_bad_input_is_one_line_exit_2_naming_the_field_and_submits_nothing(argv, field, words, monkeypatch,
                                                                            capsys):
    for dry in ([], ["--dry-run"]):
        rc, out, err = _cli([*dry, "--time", "10m", *argv, "--", "true"], monkeypatch, capsys)
        assert rc == 2 and out == "", (argv, out, err)
        assert err.count("\n") == 1 and err.startswith(f"error: {field}: ") and words in err, err


def test_job_file_fields_are_named_as_in_the_file(tmp_path, monkeypatch, capsys):
    job = tmp_path / "job.yaml"
    job.write_text("command: [echo]\ntime: 10m\nsbatch_args: [--mail-type=END, --gres=gpu:2]\n")
    rc, out, err = _cli(["-f", str(job)], monkeypatch, capsys)
    assert rc == 2 and err == "error: sbatch_args[1]: --gres is gpuhpc's; use gpus/gpu_type\n"
    job.write_text("command: [echo]\ntime: 10m\nsetup: ['echo ok', 'echo {{ bad }}']\n")
    rc, out, err = _cli(["-f", str(job)], monkeypatch, capsys)
    assert rc == 2 and err.startswith("error: setup[1]: '{{' is not allowed"), err
    job.write_text("command: [echo]\ntime: 10m\nmodules: [cuda/12.4, 'gcc; id']\n")
    rc, out, err = _cli(["-f", str(job)], monkeypatch, capsys)
    assert rc == 2 and err.startswith("error: modules[1]: 'gcc; id' is not a valid module name"), err


def test_every_option_gpuhpc_sets_is_owned():
    """No pass-through option can override one that gpuhpc writes itself (the ledger charges
    what those say): every option of the fullest translation, and pyxis', is in SBATCH_OWNED."""
    spec = JobSpec(command=("x",), template="deepspeed", resources=Resources(
        nodes=2, gpus=8, gpu_type="h100", cpus_per_task=4, mem="64G", partition="gpu", account="a", qos="q",
        constraint="ib", nodelist="n[1-2]", exclude="n3", exclusive=True, switches="1", tasks_per_node=8,
        image="nvcr.io#nvidia/pytorch:24.05-py3", mounts=("/a:/b",), container_workdir="/w"),
        workdir="/w", hold=True, dependency="afterok:1", array="0-3")
    set_here = {opt for opt, _ in sbatch_options(spec.resources, spec)} | {"no-requeue"}
    pyxis = {a[2:].split("=", 1)[0] for a in container_srun_args(spec.resources)}
    missing = sorted(o for o in set_here | pyxis if o not in SBATCH_OWNED and not o.startswith("container-"))
    assert not missing
    assert not set(SBATCH_OWNED) & set(SBATCH_PASS_THROUGH)


def test_an_option_given_twice_keeps_the_last_value(tmp_path, monkeypatch, capsys):
    job = tmp_path / "job.yaml"
    job.write_text("command: [echo]\ntime: 10m\nsbatch_args: [--mail-type=END, --comment=file]\n")
    rc, out, err = _cli(["--dry-run", "-f", str(job), "--sbatch-arg=--mail-type=FAIL"], monkeypatch, capsys)
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --mail-type=FAIL" in lines and "#SBATCH --comment=file" in lines
    assert "#SBATCH --mail-type=END" not in lines


def test_pass_through_values_are_sbatch_quoted():
    text = render(JobSpec(command=("true",), resources=Resources(
        extra=("--comment=a \"b\" #c $(id)", "--mail-type=END", "--contiguous", "--nice"))))
    lines = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert '#SBATCH --comment="a \\"b\\" #c $(id)"' in lines
    assert {"#SBATCH --mail-type=END", "#SBATCH --contiguous", "#SBATCH --nice"} <= set(lines)
    assert lines.index('#SBATCH --comment="a \\"b\\" #c $(id)"') < lines.index("#SBATCH --signal=B:USR2@60")


def test_python_mode_passes_plain_values_and_refuses_what_submitit_would_mangle():
    p = submitit_params(Resources(time="20m", extra=("--mail-type=END", "--contiguous")), "x", 60, None)
    assert p["additional_parameters"]["mail-type"] == "END" and p["additional_parameters"]["contiguous"] is True
    with pytest.raises(UserInputError, match=r"resources.extra\[0\]: --comment's value 'a b' cannot pass"):
        submitit_params(Resources(time="20m", extra=("--comment=a b",)), "x", 60, None)


# ---------------------------------------------------------------- setup: order and quoting
def test_setup_lines_in_order_with_values_quoted():
    spec = JobSpec(command=("true",), modules=("cuda/12.4", "gcc@12"), venv="~/envs/my env",
                   setup=("export A=$(hostname)",))
    lines = spec.setup_lines
    assert lines[1:] == ["module load cuda/12.4", "module load gcc@12", ". \"$HOME\"'/envs/my env'/bin/activate",
                         "export A=$(hostname)"]
    assert lines[0].startswith("type module ")
    conda = JobSpec(command=("true",), conda="my-env; id").setup_lines
    assert conda == ['eval "$("${CONDA_EXE:-conda}" shell.bash hook)" && conda activate \'my-env; id\'']


def test_gpuhpc_submit_setup_reaches_submitit_after_gpuhpcs_lines_and_is_checked():
    from submitit.slurm.slurm import _make_sbatch_string

    p = submitit_params(Resources(time="20m"), "x", 60, None, user_setup=("export A=1", "echo 'q'"))
    script = _make_sbatch_string(command="python -m x", folder="/tmp/f", **p)
    assert script.index("GPUHPC_CHECKPOINT_DIR=") < script.index("export GPUHPC_SETUP=") \
        < script.index("_gpuhpc_setup || exit") < script.index("srun ")
    with pytest.raises(UserInputError, match=r"setup\[1\]: '\{\{' is not allowed"):
        api.submit(lambda: 1, setup=["ok", "{{ x }}"], client=object())


# ---------------------------------------------------------------- setup: the templates run them
SRUN = r"""#!/bin/bash
# srun stand-in: the options, then the task command once per task of two "nodes" (one with
# --ntasks=1); pyxis' stand-in: with an image's options its tasks run with IN_IMAGE=yes
case " $* " in *" --mpi=list "*) echo pmix; exit 0;; esac
in_image=no n=2
while [ "${1#-}" != "$1" ]; do
  case "$1" in --container-image=*) in_image=yes;; --ntasks=1) n=1;; esac
  shift
done
pids=()
for ((i = 0; i < n; i++)); do IN_IMAGE=$in_image SLURM_PROCID=$i SLURM_NODEID=$i SLURM_LOCALID=0 "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""
SCONTROL = r"""#!/bin/bash
case "$*" in
  "show hostnames"*) echo node1; echo node2 ;;
  *"show node"*) echo "NodeName=node1 NodeAddr=127.0.0.1 State=IDLE" ;;
esac
"""
TORCHRUN = r"""#!/bin/bash
while [ "${1#--}" != "$1" ]; do shift; done
exec "$@"
"""
PROGRAM = ("import os, sys; rank = os.environ.get('SLURM_PROCID', 'batch'); "
           "open(os.path.join(sys.argv[1], 'rank-' + rank), 'w').write("
           "os.environ.get('ORDER', '') + '|' + os.environ.get('GREETING', '') + '|' + "
           "os.environ.get('VIRTUAL_ENV', ''))")


def _run_job(tmp_path: Path, template: str, setup: tuple[str, ...], image: str | None = None,
             **spec_kw) -> tuple[int, str, Path]:
    bindir, out, venv = tmp_path / "bin", tmp_path / "out", tmp_path / "my venv"
    for d in (bindir, out, venv / "bin"):
        d.mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text(f'export VIRTUAL_ENV={str(venv)!r}; export ORDER="$ORDER venv"\n')
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("torchrun", TORCHRUN)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    nodes = 1 if template == "single" else 2
    spec = JobSpec(command=(sys.executable, "-c", PROGRAM, str(out)), template=template,
                   resources=Resources(nodes=nodes, gpus=1, time="1h", image=image), checkpoint_dir=str(tmp_path / "ck"),
                   modules=("cuda/12.4",), venv=str(venv), setup=setup, **spec_kw)
    (tmp_path / "job.sh").write_text(render(spec))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NTASKS": str(nodes),
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_CPUS_ON_NODE": "4", "GPUHPC_PYTHON": sys.executable,
           "GPUHPC_SCRATCH_ROOT": str(tmp_path / "scratch"), "GPUHPC_TORCHRUN": str(bindir / "torchrun"),
           # a site's `module` (Lmod defines and exports it the same way)
           "BASH_FUNC_module%%": '() {  export ORDER="$ORDER module:$*"\n}'}
    env.pop("ORDER", None)
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=60, env=env)
    return res.returncode, res.stderr, out


@pytest.mark.parametrize("template", ["single", "torchrun", "deepspeed", "mpi"])
def test_setup_runs_in_every_task_in_order_before_the_program(template, tmp_path):
    rc, err, out = _run_job(tmp_path, template, ('export ORDER="$ORDER setup"', "export GREETING=hi-${SLURM_PROCID:-0}",
                                                 "echo \"a line of the user's own shell\" >&2"))
    assert rc == 0, err
    ranks = sorted(p.name for p in out.iterdir())
    assert ranks == (["rank-batch"] if template == "single" else ["rank-0", "rank-1"])
    for i, name in enumerate(ranks):
        order, greeting, venv = (out / name).read_text().split("|")
        assert order.split() == ["module:load", "cuda/12.4", "venv", "setup"]       # once, in order
        assert greeting == f"hi-{0 if template == 'single' else i}" and venv.endswith("/my venv")
    assert "a line of the user's own shell" in err


@pytest.mark.parametrize("template", ["single", "torchrun", "deepspeed", "mpi"])
def test_with_an_image_setup_runs_in_the_container_only(template, tmp_path):
    rc, err, out = _run_job(tmp_path, template, ('export ORDER="$ORDER setup"', 'export GREETING="$IN_IMAGE"'),
                            image="nvcr.io#nvidia/pytorch:24.05-py3")
    assert rc == 0, err
    ranks = sorted(p.name for p in out.iterdir())
    assert ranks == (["rank-0"] if template == "single" else ["rank-0", "rank-1"])     # the program's step
    for name in ranks:
        order, greeting, _ = (out / name).read_text().split("|")
        assert greeting == "yes" and order.split() == ["module:load", "cuda/12.4", "venv", "setup"]   # not twice


@pytest.mark.parametrize("template", ["single", "deepspeed"])
def test_a_failing_setup_line_ends_the_job_before_the_program(template, tmp_path):
    rc, err, out = _run_job(tmp_path, template, ("export GREETING=x", "false", "export NEVER=1"))
    assert rc == 1 and not list(out.iterdir()), err
    assert "setup line 5 failed (exit 1)" in err and ": false" in err   # module init, module, venv, then ours


def test_no_setup_renders_no_wrapper_and_runs_as_before(tmp_path):
    text = render(JobSpec(command=("true",), template="mpi", resources=Resources(nodes=2, gpus=1)))
    assert "export GPUHPC_SETUP=''" in text
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$FAKE_OUT"\n')
    (bindir / "srun").chmod(0o755)
    wrap = text[text.index("_gpuhpc_wrap=()"):text.index("# ---------------------------------------------------------------- the program")]
    script = f'{wrap}\nsrun --mpi=pmix "${{_gpuhpc_wrap[@]}}" prog arg\n'
    subprocess.run(["bash", "-c", "GPUHPC_SETUP=; " + script], check=True,
                   env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_OUT": str(tmp_path / "argv")})
    assert (tmp_path / "argv").read_text().split() == ["--mpi=pmix", "prog", "arg"]


def test_setup_lines_inside_a_batch_block_are_refused_not_dropped():
    with pytest.raises(UserInputError, match=r"^setup: setup lines are not taken inside gpuhpc.batch\(\)"):
        with api.batch():
            api.submit(lambda: 1, setup=["echo hi"], client=object())
