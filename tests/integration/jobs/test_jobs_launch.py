"""Launchers and hostile input on the real cluster: a 2-node torchrun job's distributed
environment, and job names/arguments/env values that must never reach a shell."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jobs_helpers import HERE, gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration


def _finished(slurm, job_id):
    return lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def test_torchrun_two_nodes_consistent_environment(jobs_env, tmp_path, slurm, track):
    out = tmp_path / "ranks"
    out.mkdir()
    res = gpuhpc("submit", "--template", "torchrun", "--nodes", "2", "--gpus", "2", "--gpu-type", "h100",
                 "--partition", "gpu", "--time", "15m", "--name", "gpuhpc-test-torchrun", "--json", "--",
                 "python", str(HERE / "print_dist_env.py"), str(out), "--lr", "3e-4",
                 env={"GPUHPC_TORCHRUN": str(HERE / "fake_torchrun.py")})
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(_finished(slurm, job_id), 120, f"torchrun job {job_id}")
    from gpuhpc.jobs.api import Job

    job = Job(job_id, client=slurm)
    log = job.logs()
    assert job.state.value == "COMPLETED", log
    envs = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert len(envs) == 4, log
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1, 2, 3]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {envs[0]["MASTER_ADDR"]}
    assert {e["MASTER_PORT"] for e in envs} == {envs[0]["MASTER_PORT"]}
    by_node: dict[str, list] = {}
    for e in envs:
        by_node.setdefault(e["SLURM_NODEID"], []).append(e)
        assert int(e["RANK"]) == int(e["GROUP_RANK"]) * 2 + int(e["LOCAL_RANK"])
        assert e["GROUP_RANK"] == e["SLURM_NODEID"]
        assert e["argv"] == ["--lr", "3e-4"]
    assert sorted(by_node) == ["0", "1"]
    assert {e["SLURMD_NODENAME"] for e in envs} == {"gpu-node1", "gpu-node2"}
    for node_envs in by_node.values():
        assert sorted(int(e["LOCAL_RANK"]) for e in node_envs) == [0, 1]
    # MASTER_ADDR is the first node's NodeAddr (node names need not resolve)
    first = next(e["SLURMD_NODENAME"] for e in envs if e["GROUP_RANK"] == "0")
    rec = slurm.run(["scontrol", "--oneliner", "show", "node", first]).stdout
    addr = [w.split("=", 1)[1] for w in rec.split() if w.startswith("NodeAddr=")]
    assert addr and envs[0]["MASTER_ADDR"] == addr[0]


HOSTILE_NAME = "x; touch /var/tmp/gpuhpc-pwned"
HOSTILE_ARGS = ["$(touch /var/tmp/gpuhpc-pwned2)", "`touch /var/tmp/gpuhpc-pwned3`", "a'b\"c", "ünïcødé ✓ ;|&<>*?", "--", "$HOME"]
HOSTILE_ENV = "$(touch /var/tmp/gpuhpc-pwned4); `touch /var/tmp/gpuhpc-pwned5` 'q' \"dq\" ünï"
PWNED = [Path(f"/var/tmp/gpuhpc-pwned{s}") for s in ("", "2", "3", "4", "5")]


def test_hostile_names_arguments_and_env_never_reach_a_shell(jobs_env, slurm, track):
    for p in PWNED:
        p.unlink(missing_ok=True)
    printer = "import json, os, sys; print('ARGV ' + json.dumps([sys.argv[1:], os.environ['EVIL']]))"
    res = gpuhpc("submit", "--partition", "cpu", "--time", "15m", "--name", HOSTILE_NAME, "--env",
                 f"EVIL={HOSTILE_ENV}", "--json", "--", sys.executable, "-c", printer, *HOSTILE_ARGS)
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(_finished(slurm, job_id), 90, f"job {job_id}")
    from gpuhpc.jobs.api import Job

    job = Job(job_id, client=slurm)
    log = job.logs()
    assert job.state.value == "COMPLETED", log
    for p in PWNED:
        assert not p.exists(), f"{p} was created: input reached a shell"
    line = next(line for line in log.splitlines() if line.startswith("ARGV "))
    assert json.loads(line[5:]) == [HOSTILE_ARGS, HOSTILE_ENV]
    assert slurm.show_job(job_id)["JobName"] == HOSTILE_NAME
    # the JSON listing carries the exact name back
    listed = json.loads(gpuhpc("status", job_id, "--json").stdout)
    assert listed["name"] == HOSTILE_NAME and listed["state"] == "COMPLETED"


@pytest.mark.parametrize("args", [
    ["--name", "bad\nname"],
    ["--env", "X=line1\nline2"],
    ["--name", "esc\x1b[31m"],
])
def test_control_characters_are_rejected_before_sbatch(jobs_env, args):
    res = gpuhpc("submit", "--partition", "cpu", *args, "--", "true")
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and "control character" in res.stderr
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1


def test_control_character_in_argument_rejected(jobs_env):
    res = gpuhpc("submit", "--partition", "cpu", "--", "echo", "a\nb")
    assert res.returncode == 2 and "command[1]" in res.stderr


def test_jobs_status_logs_cancel_json(jobs_env, slurm, track):
    res = gpuhpc("submit", "--partition", "cpu", "--time", "15m", "--hold", "--name", "gpuhpc-test-manage",
                 "--json", "--", "sleep", "30")
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    rows = json.loads(gpuhpc("jobs", "--json").stdout)
    mine = [r for r in rows if r["job_id"] == job_id]
    assert mine and mine[0]["state"] == "PENDING" and "gpu_hours" in mine[0]
    st = json.loads(gpuhpc("status", job_id, "--json").stdout)
    assert st["state"] == "PENDING" and st["finished"] is False
    assert st["log"].endswith(f"gpuhpc-test-manage-{job_id}.out")
    out = gpuhpc("cancel", job_id, "--json")
    assert out.returncode == 0 and json.loads(out.stdout) == [{"job_id": job_id, "cancelled": True}]
    wait_for(lambda: job_state(slurm, job_id) == "CANCELLED", 30, "cancel")
    logs = gpuhpc("logs", job_id, "--json")
    assert logs.returncode == 0 and json.loads(logs.stdout)["job_id"] == job_id
    assert gpuhpc("status", "12x", "--json").returncode == 2


def test_mpi_and_deepspeed_templates_start_one_rank_per_gpu(jobs_env, tmp_path, slurm, track):
    printer = ("import os, sys; e = os.environ.get; open(os.path.join(sys.argv[1], e('SLURM_PROCID')), 'w').write("
               "' '.join(['RANKINFO', e('SLURM_PROCID'), e('PMI_RANK') or e('PMIX_RANK') or 'None', "
               "e('RANK', 'None'), e('LOCAL_RANK', 'None'), e('WORLD_SIZE', 'None'), e('MASTER_ADDR', 'None'), "
               "e('SLURMD_NODENAME', 'None'), e('GPUHPC_LOCAL_RANK', 'None'), e('CUDA_VISIBLE_DEVICES', 'None')]))")
    ids = {}
    for template in ("mpi", "deepspeed"):
        (tmp_path / template).mkdir()
        res = gpuhpc("submit", "--template", template, "--nodes", "2", "--gpus", "2", "--gpu-type", "h100",
                     "--partition", "gpu", "--time", "15m", "--name", f"gpuhpc-test-{template}", "--json", "--",
                     sys.executable, "-c", printer, str(tmp_path / template))
        assert res.returncode == 0, res.stderr
        ids[template] = json.loads(res.stdout)["job_id"]
        track(ids[template])
    from gpuhpc.jobs.api import Job

    for template, job_id in ids.items():
        wait_for(_finished(slurm, job_id), 120, f"{template} job {job_id}")
        job = Job(job_id, client=slurm)
        log = job.logs()
        assert job.state.value == "COMPLETED", log
        rows = [p.read_text().split()[1:] for p in (tmp_path / template).iterdir()]
        assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3], log
        if template == "mpi":
            assert "mpi: srun --mpi=pmix" in log or "mpi: srun --mpi=pmi2" in log
            assert sorted(r[1] for r in rows) == ["0", "1", "2", "3"]       # PMI rank from the plugin
        else:
            assert all(r[2] == r[0] and r[4] == "4" for r in rows)          # RANK, WORLD_SIZE
            assert {r[5] for r in rows} != {"None"}
            # as under DeepSpeed's launcher: LOCAL_RANK is the place on the node, and every task
            # sees the node's GPUs (no --gpu-bind), so cuda:LOCAL_RANK is its own
            assert sorted(r[7] for r in rows) == ["0", "0", "1", "1"], rows
            assert sorted(r[3] for r in rows) == ["0", "0", "1", "1"], rows
            for node in {r[6] for r in rows}:
                gpus = [r[8] for r in rows if r[6] == node]
                assert len(gpus) == 2 and len(set(gpus)) == 1 and len(gpus[0].split(",")) == 2, rows
            assert "(no binding)" in log


def test_logs_follow_until_the_job_ends(jobs_env, slurm, track):
    res = gpuhpc("submit", "--partition", "cpu", "--time", "15m", "--name", "gpuhpc-test-follow", "--json", "--",
                 "bash", "-c", "echo first; sleep 4; echo second")
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    followed = gpuhpc("logs", job_id, "-f", timeout=60)
    assert followed.returncode == 0, followed.stderr
    assert "first" in followed.stdout and "second" in followed.stdout
    assert job_state(slurm, job_id) == "COMPLETED"
