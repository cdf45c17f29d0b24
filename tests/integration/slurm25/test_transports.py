"""Issue 37 points 3 and 4 on Slurm 25.11 built from source: one SlurmClient, three transports.

The same assertions run against each transport (pyslurm in-process, ``squeue/sacct --json``, the
framed text parsers): jobs (the hostile names of tests/integration/security/test_slurm_output.py,
submitted with plain ``sbatch -J``: whole, none forged), an array's tasks, a job on a GPU, the
node's GPUs, the partitions and accounting (a private 25.11 slurmdbd); the path counter shows which
transport served each read, and the three transports return the same records. ``auto`` picks
pyslurm where it matches the running 25.11, else ``--json``.
"""
from __future__ import annotations

import dataclasses

import pytest

from gpuhpc.slurm import pyslurm_reads
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner
from integration.security.test_slurm_output import NAMES, RUN_NAME
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

TRANSPORTS = ["pyslurm", "json", "cli"]


def sbatch(cluster, *args: str) -> str:
    res = cluster.client.run(["sbatch", "--parsable", "-o", "/dev/null", *args])
    return res.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def jobs(slurm25):
    held = {sbatch(slurm25, "-H", "-p", "s25", "-t", "1", "-J", name, "--wrap", "true"): name for name in NAMES}
    array = sbatch(slurm25, "-H", "-p", "s25", "-t", "1", "--array=0-2", "-J", NAMES[1], "--wrap", "true")
    gpu = sbatch(slurm25, "-p", "s25", "--gres=gpu:h100:1", "-t", "5", "-J", "on-a-gpu", "--wrap", "sleep 600")
    done = sbatch(slurm25, "-p", "s25-hi", "--gres=gpu:h100:1", "-t", "1", "-J", RUN_NAME, "--wrap", "true")
    client = slurm25.client
    wait_for(lambda: any(r.job_id == gpu and r.state.state.value == "RUNNING" for r in client.queue(job_ids=[gpu])),
             60, f"job {gpu} to run ({slurm25.logs()})")
    # the finished job's record in the private slurmdbd: its end, with its GPU
    wait_for(lambda: [a for a in client.accounting(job_ids=[done]) if a.job_id == done and a.state.state.is_finished
                      and a.end != "Unknown" and a.gpus], 120, f"job {done}'s end in accounting")
    yield {"held": held, "array": array, "gpu": gpu, "done": done}
    mine = [*held, array, gpu, done]
    for job in mine:
        client.run(["scancel", job], check=False)
    wait_for(lambda: all(r.state.state.is_finished for r in client.queue(job_ids=mine)), 60,
             f"jobs {mine} to end")


@pytest.fixture
def client(request, slurm25):
    transport = request.param
    if transport == "pyslurm":
        request.getfixturevalue("pyslurm_module")
    c = SlurmClient(LocalRunner(env=slurm25.slurm_env), transport=transport, timeout=30)
    assert c.transport == transport
    return c


@pytest.mark.parametrize("client", TRANSPORTS, indirect=True)
def test_queue_hostile_names_arrays_and_gpus(client, jobs):
    rows = client.queue()
    by_id = {r.job_id: r for r in rows}
    assert {j: by_id[j].name for j in jobs["held"]} == jobs["held"]                 # every name whole
    assert not [r for r in rows if r.job_id == "424242" or r.name == "forged"]      # none forged
    assert {j: by_id[j].state.state.value for j in jobs["held"]} == dict.fromkeys(jobs["held"], "PENDING")
    assert {j: by_id[j].reason for j in jobs["held"]} == dict.fromkeys(jobs["held"], "JobHeldUser")
    tasks = sorted((r.array_job_id, r.array_task_id, r.name) for r in rows if r.array_job_id == jobs["array"])
    assert tasks == [(jobs["array"], str(i), NAMES[1]) for i in range(3)]
    gpu = by_id[jobs["gpu"]]
    assert (gpu.state.state.value, gpu.partition, gpu.nodelist, gpu.nodes, gpu.user) == \
        ("RUNNING", "s25", "s25-node1", 1, "root")
    assert gpu.tres_per_node == "gres/gpu:h100:1"
    # by job id and by user, as gpuhpc status and gpuhpc jobs ask
    assert [r.job_id for r in client.queue(job_ids=[jobs["gpu"]])] == [jobs["gpu"]]
    assert {r.job_id for r in client.queue(user="root")} == set(by_id)
    assert client.queue(user="nobody") == []
    assert set(client.calls) == {("queue", client.transport)} and client.calls[("queue", client.transport)] == 4


@pytest.mark.parametrize("client", TRANSPORTS, indirect=True)
def test_nodes_and_partitions(client, jobs):
    (node,) = [n for n in client.nodes() if n.name == "s25-node1"]
    assert (node.cpus, node.gpus_total, node.gpus_alloc, node.partitions) == (2, {"h100": 2}, {"h100": 1},
                                                                               ("s25", "s25-hi"))
    assert node.state.startswith("MIXED") and node.real_memory_mb == 500
    parts = {p.name: p for p in client.partitions()}
    assert set(parts) == {"s25", "s25-hi"}
    assert (parts["s25"].default, parts["s25-hi"].default, parts["s25-hi"].priority_tier) == (True, False, 10)
    assert (parts["s25"].state, parts["s25"].nodes, parts["s25"].total_cpus) == ("UP", "s25-node1", 2)
    assert client.calls == {("nodes", client.transport): 1, ("partitions", client.transport): 1}


@pytest.mark.parametrize("client", TRANSPORTS, indirect=True)
def test_accounting_bills_the_real_job(client, jobs):
    rows = client.accounting(job_ids=[jobs["done"]])
    (run,) = [r for r in rows if r.job_id == jobs["done"]]
    assert not [r for r in rows if r.job_id == "424243" or r.name == "forged"]
    # slurmdbd keeps the newline and 0x1f (it cuts a name at 255 bytes); still one row, one name
    assert RUN_NAME.startswith(run.name) and "\n424243\x1f" in run.name
    assert (run.state.state.value, run.user, run.partition, run.gpus, run.cluster) == \
        ("COMPLETED", "root", "s25-hi", {"h100": 1}, "gpuhpcs25")
    assert run.exit_code == "0:0" and run.time_limit == "00:01:00" and run.end != "Unknown"
    assert client.calls == {("accounting", client.transport): 1}


def test_the_three_transports_return_the_same_records(slurm25, jobs, pyslurm_module):
    clients = {t: SlurmClient(LocalRunner(env=slurm25.slurm_env), transport=t) for t in TRANSPORTS}

    def same(read, key, drop=()):
        got = {t: sorted((dataclasses.replace(r, **{f: None for f in drop}) for r in getattr(c, read)()), key=key)
               for t, c in clients.items()}
        assert got["pyslurm"] == got["cli"], read
        assert got["json"] == got["cli"], read

    same("nodes", key=lambda n: n.name)
    same("partitions", key=lambda p: p.name)
    mine = set(jobs["held"]) | {jobs["gpu"]}
    queue = {t: sorted((dataclasses.replace(r, elapsed="") for r in c.queue() if r.job_id in mine),
                       key=lambda r: r.job_id) for t, c in clients.items()}
    assert queue["pyslurm"] == queue["cli"] and queue["json"] == queue["cli"]
    acct = {t: [r for r in c.accounting(job_ids=[jobs["done"]])] for t, c in clients.items()}
    assert acct["pyslurm"] == acct["cli"] and acct["json"] == acct["cli"]


def test_auto_picks_pyslurm_where_it_matches_else_json(slurm25, jobs, pyslurm_module, monkeypatch):
    monkeypatch.delenv("GPUHPC_SLURM_TRANSPORT", raising=False)
    auto = SlurmClient(LocalRunner(env=slurm25.slurm_env))
    assert auto.version[:2] == (25, 11) and auto.transport == "pyslurm"
    auto.queue(job_ids=[jobs["gpu"]])
    auto.nodes()
    assert auto.calls == {("queue", "pyslurm"): 1, ("nodes", "pyslurm"): 1}
    monkeypatch.setattr(pyslurm_reads, "available_version", lambda: None)       # no pyslurm here
    assert SlurmClient(LocalRunner(env=slurm25.slurm_env)).transport == "json"
