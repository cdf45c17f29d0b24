"""Rendered job scripts run on bash 4.4 (RHEL/Rocky 8), pick a rendezvous port below the
ephemeral range that is free on the node, and give srun tasks their CPUs."""
from __future__ import annotations

import re
import socket
import subprocess

import pytest

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources

TEMPLATES = ["single", "torchrun", "deepspeed", "mpi"]

#: constructs newer than bash 4.4, with the version that added them
BASH5_ONLY = {
    r"\bwait\s+(-\w+\s+)*-\w*[pf]\b": "wait -p (5.1) / wait -f (5.0)",
    r"\$\{[^}]*@[ULuKk]\}": "${var@U} ${var@u} ${var@L} ${var@K} ${var@k} (5.1/5.2)",
    r"\bEPOCHSECONDS\b|\bEPOCHREALTIME\b": "$EPOCHSECONDS / $EPOCHREALTIME (5.0)",
    r"\bSRANDOM\b": "$SRANDOM (5.1)",
    r"\bBASH_ARGV0\b": "BASH_ARGV0 (5.0)",
    r"assoc_expand_once|patsub_replacement|varredir_close|localvar_unset": "shopt options of 5.x",
}


def _spec(template: str) -> JobSpec:
    return JobSpec(command=("python", "-u", "train.py"), template=template,
                   resources=Resources(nodes=1 if template == "single" else 2, gpus=8, gpu_type="h100"))


@pytest.mark.parametrize("template", TEMPLATES)
def test_rendered_scripts_use_only_bash_4_4(template):
    text = render(_spec(template))
    for pattern, what in BASH5_ONLY.items():
        assert not re.search(pattern, text), f"{template}: {what}"
    assert "--kill-on-bad-exit=1" not in text


def test_the_list_catches_what_it_should():
    for line in ('wait -n -p done "$a" "$b"', "wait -p x", 'echo "${v@U}"', "t=$EPOCHSECONDS"):
        assert any(re.search(p, line) for p in BASH5_ONLY), line
    assert not any(re.search(p, 'wait "$pid"; echo "${v@Q}"') for p in BASH5_ONLY)


def _function(text: str, name: str) -> str:
    start = text.index(f"{name}() {{")
    end = text.index("\n}\n", start)
    return text[start:end + 3]


def _bash(text: str, call: str, env: dict[str, str]) -> str:
    import os
    import sys

    return subprocess.run(["bash", "-c", text + "\n" + call], capture_output=True, text=True, check=True,
                          env={**os.environ, "GPUHPC_PYTHON": sys.executable, **env}).stdout.strip()


def test_master_port_is_below_the_ephemeral_range_and_free():
    text = _function(render(_spec("torchrun")), "_gpuhpc_free_port")
    ports = {int(_bash(text, "_gpuhpc_free_port", {"SLURM_JOB_ID": str(j)})) for j in (1, 2, 19999, 40123)}
    assert len(ports) == 4 and all(15000 <= p < 32000 for p in ports), ports
    taken = int(_bash(text, "_gpuhpc_free_port", {"SLURM_JOB_ID": "555"}))
    with socket.create_server(("", taken)):
        other = int(_bash(text, "_gpuhpc_free_port", {"SLURM_JOB_ID": "555"}))
    assert other != taken and 15000 <= other < 32000


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_CPUS_ON_NODE": "16", "SLURM_NTASKS_PER_NODE": "8"}, "2"),
    ({"SLURM_CPUS_ON_NODE": "16", "SLURM_NTASKS_PER_NODE": "1"}, "16"),
    ({"SLURM_CPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "8"}, "1"),
    ({"SLURM_CPUS_ON_NODE": "16", "SLURM_NTASKS_PER_NODE": "8", "SLURM_CPUS_PER_TASK": "3"}, "3"),
])
def test_cpus_per_srun_task(env, expected):
    text = _function(render(_spec("deepspeed")), "_gpuhpc_cpus_per_task")
    clean = {"SLURM_CPUS_PER_TASK": "", "SLURM_NTASKS_PER_NODE": "", "SLURM_CPUS_ON_NODE": "", **env}
    call = "[ -n \"$SLURM_CPUS_PER_TASK\" ] || unset SLURM_CPUS_PER_TASK; _gpuhpc_cpus_per_task"
    assert _bash(text, call, clean) == expected


@pytest.mark.parametrize("template", ["torchrun", "deepspeed", "mpi"])
def test_srun_lines_pass_cpus_per_task(template):
    assert '--cpus-per-task="$_gpuhpc_cpt"' in render(_spec(template))


def test_single_on_two_nodes_exits_2_from_the_cli():
    import sys

    res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--nodes", "2", "--dry-run", "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: template: the single template runs one process on one node")
    assert len(res.stderr.strip().splitlines()) == 1
