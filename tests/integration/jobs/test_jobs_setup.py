"""Environment setup and sbatch pass-through on the real cluster (docs/jobs.md, "Environment setup
and Slurm options"): a 2-node job's venv and setup lines run on each node before its rank starts;
``--sbatch-arg`` options reach Slurm's job record; an option gpuhpc owns and a setup line with
template syntax are refused (exit 2, one line) before sbatch is called."""
from __future__ import annotations

import json
import os
import uuid

import pytest
from jobs_helpers import gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration

RANK_SH = r"""#!/bin/bash
# one rank: what the setup lines left in its environment and on its node
made=no; [ -d "$OUT/made-by-setup-$SLURMD_NODENAME" ] && made=yes
echo "rank=$RANK node=$SLURMD_NODENAME setup_node=${SETUP_NODE:-} venv=${VENV_MARK:-} made=$made" > "$OUT/rank-$RANK"
"""


def _name() -> str:
    return f"gpuhpc-test-setup-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sbatch_calls(jobs_env, tmp_path, monkeypatch):
    """A recording ``sbatch`` first on PATH (tests/recording.py) for this test's ``gpuhpc`` commands."""
    from recording import record_calls

    calls = record_calls(tmp_path / "bin", "sbatch")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_setup_lines_run_on_every_node_before_the_program(jobs_env, tmp_path, slurm, track):
    out, venv = tmp_path / "out", tmp_path / "venv"
    out.mkdir()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text('export VENV_MARK="active-on-$SLURMD_NODENAME"\n')
    (tmp_path / "rank.sh").write_text(RANK_SH)
    res = gpuhpc("submit", "--template", "deepspeed", "--nodes", "2", "--gpus", "1", "--gpu-type", "h100",
                 "--partition", "gpu", "--time", "5m", "--name", _name(), "--json", "--env", f"OUT={out}",
                 "--venv", str(venv), "--setup", 'export SETUP_NODE="$SLURMD_NODENAME"',
                 "--setup", 'mkdir -p -- "$OUT/made-by-setup-$SLURMD_NODENAME"',
                 "--", "bash", str(tmp_path / "rank.sh"))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", ""), 120,
             f"job {job_id} to end")
    assert job_state(slurm, job_id) == "COMPLETED", (out / "..").resolve()
    seen = {}
    for rank in (0, 1):
        fields = dict(kv.split("=", 1) for kv in (out / f"rank-{rank}").read_text().split())
        node = fields["node"]
        # the lines ran on this rank's own node (its SLURMD_NODENAME, its directory) before it started
        assert fields == {"rank": str(rank), "node": node, "setup_node": node, "venv": f"active-on-{node}",
                          "made": "yes"}, fields
        seen[rank] = node
    assert len(set(seen.values())) == 2, seen            # two nodes, one rank each


def test_pass_through_options_reach_slurm_and_owned_ones_are_refused(jobs_env, slurm, sbatch_calls, track):
    name = _name()
    for argv, words in ((["--sbatch-arg=--gres=gpu:h100:8"], "error: --sbatch-arg[0]: --gres is gpuhpc's; use gpus/gpu_type"),
                        (["--sbatch-arg=--partition=gpu-hi"], "error: --sbatch-arg[0]: --partition is gpuhpc's"),
                        (["--setup", "echo {{ x }}"], "error: --setup[0]: '{{' is not allowed in a setup line")):
        for dry in ([], ["--dry-run"]):
            res = gpuhpc("submit", *dry, "--partition", "cpu", "--time", "5m", "--name", name, *argv, "--", "true")
            assert res.returncode == 2 and res.stdout == "" and res.stderr.count("\n") == 1, res
            assert res.stderr.startswith(words), res.stderr
    assert sbatch_calls() == []                          # nothing reached sbatch
    assert not [r for r in slurm.queue(user=None) if r.name == name]
    res = gpuhpc("submit", "--partition", "cpu", "--time", "5m", "--hold", "--name", name,
                 "--sbatch-arg", "--comment=hello from gpuhpc", "--sbatch-arg=--mail-type=END", "--", "true")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    track(job_id)
    assert len(sbatch_calls()) == 1                      # the wrapper is on the path the refusals took
    rec = slurm.show_job(job_id)
    assert rec["Comment"] == "hello from gpuhpc" and rec["MailType"] == "END", rec


def test_python_callable_gets_its_setup_lines_and_options(jobs_env, slurm, track):
    """gpuhpc.submit(fn, setup=[...]) through submitit: the lines run in its batch script before
    the call, and Resources(extra=...) reaches Slurm's record."""
    import gpuhpc

    job = gpuhpc.submit(lambda: os.environ.get("SETUP_MARK"), name="gpuhpc-test-setup-py",
                        resources=gpuhpc.Resources(partition="cpu", time="5m", extra=("--comment=py-setup",)),
                        setup=['export SETUP_MARK="set-on-$SLURMD_NODENAME"'])
    track(job.job_id)
    assert slurm.show_job(job.job_id)["Comment"] == "py-setup"
    node = job.result(timeout=120)
    assert node.startswith("set-on-") and node != "set-on-", node
