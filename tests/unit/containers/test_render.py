"""Every template runs its program's srun step in the image with pyxis' options, quoted; without
an image the scripts are as before; a Python function is refused unless the image is declared fit."""
from __future__ import annotations

import re
import subprocess

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs.api import submit
from gpuhpc.jobs.render import render, render_jinja, context
from gpuhpc.jobs.spec import JobSpec, Resources
from gpuhpc.jobs.submitit_adapters import submitit_params

IMAGE = "127.0.0.1:5000#gpuhpc/test@sha256:" + "0f" * 32
STUBS = r"""
srun() { printf '%s\n' "$@"; }
setsid() { if [ "$1" = srun ]; then "$@"; else echo RAN; fi; }
bash() { :; }
_gpuhpc_cpus_per_task() { echo 4; }
SLURM_JOB_ID=42 SLURM_JOB_NUM_NODES=2 _gpuhpc_cpt=4 _gpuhpc_mpi=pmix _gpuhpc_binding=()
_gpuhpc_cmd=(python train.py)
"""


def _launch(text: str) -> str:
    """The template's launch command (from `setsid` to the `&` that ends it)."""
    m = re.search(r"^setsid .*?&$", text, re.M | re.S)
    assert m, text
    return m.group(0)


def _srun_argv(text: str) -> list[str]:
    """The words the launch line gives srun, as bash parses them (the single template's lines
    from its image's options on)."""
    launch = _launch(text)
    if "_gpuhpc_container=(" in text:
        launch = text[text.index("_gpuhpc_container=("):text.index(launch) + len(launch)]
    out = subprocess.run(["bash", "-c", STUBS + launch[:-1] + "\nwait"], capture_output=True, text=True,
                         check=True).stdout
    return [w for w in out.splitlines() if w != "RAN"]


def _spec(template: str, **res) -> JobSpec:
    return JobSpec(command=("python", "train.py"), template=template, workdir="/home/u/proj",
                   resources=Resources(nodes=1 if template == "single" else 2, gpus=1, time="1h", **res))


@pytest.mark.parametrize("template", ["single", "torchrun", "deepspeed", "mpi"])
def test_every_template_runs_its_step_in_the_image(template, tmp_path):
    text = render(_spec(template, image=IMAGE, mounts=("/ckpt:/ckpt", "/data:/data:ro")))
    (tmp_path / "job.sh").write_text(text)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)
    argv = _srun_argv(text)
    assert f"--container-image={IMAGE}" in argv
    assert "--container-mounts=/ckpt:/ckpt,/data:/data:ro" in argv
    assert "--container-workdir=/home/u/proj" in argv            # the job's workdir by default
    assert "--container-name=gpuhpc-42" in argv                  # one per job: steps reuse the import
    assert "#SBATCH --container" not in text                     # '#' would end an #SBATCH line
    if template == "single":
        assert argv[:3] == ["--nodes=1", "--ntasks=1", "--cpus-per-task=4"] and argv[-2:] == ["python", "train.py"]


@pytest.mark.parametrize("template", ["single", "torchrun", "deepspeed", "mpi"])
def test_without_an_image_nothing_changes(template):
    text = render(_spec(template))
    assert "--container" not in text
    assert render_jinja(template, context(_spec(template))) == text
    if template == "single":
        assert _srun_argv(text) == []                  # the program runs in the batch step, no srun


def test_container_workdir_wins_and_skeleton_matches_jinja():
    spec = _spec("torchrun", image="nvcr.io#nvidia/pytorch:24.05-py3", container_workdir="/workspace")
    text = render(spec)
    assert render_jinja("torchrun", context(spec)) == text
    argv = _srun_argv(text)
    assert "--container-workdir=/workspace" in argv
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'" in text      # quoted: '#' is no comment


def test_python_function_in_an_image_is_refused_before_sbatch(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(tmp_path / "none.toml"))
    with pytest.raises(UserInputError, match="image_python.*cloudpickle"):
        submit(print, resources=Resources(image=IMAGE), client=object())


def test_submitit_step_runs_in_the_image():
    params = submitit_params(Resources(image=IMAGE, mounts=("/a:/a",), image_python=True), "f", 60, None)
    assert params["srun_args"] == [f"--container-image={IMAGE}", "--container-mounts=/a:/a"]
    assert "srun_args" not in submitit_params(Resources(), "f", 60, None)


def test_python_function_in_an_image_over_ssh_is_refused(monkeypatch, tmp_path):
    from types import SimpleNamespace

    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(tmp_path / "none.toml"))
    remote = SimpleNamespace(runner=SimpleNamespace(is_local=False))
    with pytest.raises(UserInputError, match="image: a Python function in a container image cannot be submitted over SSH"):
        submit(print, resources=Resources(image=IMAGE, image_python=True), client=remote)
