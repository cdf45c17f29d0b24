"""``gpuhpc power resume|suspend|resume-fail``: SLURM_RESUME_FILE parsing, one launch per job
(all or nothing), idempotency, the records they keep; nothing runs (the worker is not spawned)."""
from __future__ import annotations

import json

import pytest

from gpuhpc.elastic.config import ElasticConfig, Pool, config_from_context, load_config
from gpuhpc.elastic.power import release_plans, resume_plans, run_program
from gpuhpc.elastic.resumefile import Launch, parse_resume_file, plan_launches
from gpuhpc.elastic.store import Store
from gpuhpc.errors import UserInputError

from .fakes import RecordingSlurm

RESUME = json.dumps({
    "all_nodes_resume": "spot[01-03],od01",
    "jobs": [
        {"job_id": 140814, "nodes_alloc": "spot[01-03]", "nodes_resume": "spot[01,03]", "features": "",
         "partition": "spot", "oversubscribe": "OK", "reservation": None, "extra": "later Slurm"},
        {"job_id": 140815, "nodes_alloc": "od01", "nodes_resume": "od01", "partition": "ondemand"},
    ]})


def config(tmp_path, **kw) -> ElasticConfig:
    pools = (Pool("spot", ("spot01", "spot02", "spot03"), "local", market="spot", capacity_cooldown=60),
             Pool("od", ("od01", "od02"), "local", price_tier=2))
    return ElasticConfig(cluster="c", pools=pools, state_dir=str(tmp_path / "state"), **kw)


# what 22.05.8 writes (src/slurmctld/power_save.c at slurm-22-05-8-1: "jobs" first, "nodes" per job,
# "all_nodes"), as the elastic scenarios' private controller gave it
RESUME_2205 = '{"jobs":[{"job_id":140814,"nodes":"spot[01,03]"},{"job_id":140815,"nodes":"od01"},' \
              '{"job_id":140816,"nodes":""}],"all_nodes":"spot[01,03],od01"}'


def test_the_resume_file_maps_jobs_to_the_nodes_to_resume():
    assert parse_resume_file(RESUME) == [("140814", ("spot01", "spot03")), ("140815", ("od01",))]
    assert parse_resume_file(None) == parse_resume_file("") == parse_resume_file("{not json") == []


def test_the_22_05_resume_file_maps_jobs_too():
    """22.05 names a job's nodes to resume ``nodes`` (23.02: ``nodes_resume``, beside ``nodes_alloc``);
    a job with none this call is left out, and what is not a job map is no map."""
    assert parse_resume_file(RESUME_2205) == [("140814", ("spot01", "spot03")), ("140815", ("od01",))]
    assert plan_launches(["spot01", "spot03", "od01", "od02"], RESUME_2205) == [
        Launch(("spot01", "spot03"), "140814"), Launch(("od01",), "140815"), Launch(("od02",))]
    # 23.02+: nodes_resume wins even when empty (those nodes are resumed for another job)
    later = json.dumps({"jobs": [{"job_id": 1, "nodes_alloc": "spot[01-02]", "nodes_resume": ""},
                                 {"job_id": 2, "nodes_alloc": "spot[01-02]", "nodes_resume": "spot[01-02]"}]})
    assert parse_resume_file(later) == [("2", ("spot01", "spot02"))]
    for bad in ("[]", '{"jobs": {}}', '{"jobs": [1, {"job_id": 3, "nodes": "spot[01"}]}', '{"jobs": null}'):
        assert parse_resume_file(bad) == [], bad


def test_one_launch_per_job_then_one_per_node_without_a_job():
    launches = plan_launches(["spot01", "spot03", "od01", "od02"], RESUME)
    assert launches == [Launch(("spot01", "spot03"), "140814"), Launch(("od01",), "140815"), Launch(("od02",))]
    assert plan_launches(["spot02"], None) == [Launch(("spot02",))]


def test_resume_records_nodes_and_a_second_call_launches_nothing(tmp_path):
    cfg = config(tmp_path)
    store = Store(cfg.state_dir)
    plans = resume_plans(cfg, ["spot01", "spot03", "od01", "gpu-node1"], RESUME, store, now=1000.0)
    assert [(p.op, p.pool, p.nodes, p.job_id) for p in plans] == [
        ("launch", "spot", ("spot01", "spot03"), "140814"), ("launch", "od", ("od01",), "140815")]
    assert plans[0].token != plans[1].token and plans[0].token.startswith("c-140814-")
    state = store.read()
    assert sorted(state.nodes) == ["od01", "spot01", "spot03"]        # not gpu-node1: no cloud pool
    assert state.nodes["spot01"].token == state.nodes["spot03"].token == plans[0].token
    assert resume_plans(cfg, ["spot01", "spot03"], RESUME, store, now=1010.0) == []   # slurmctld ran it again
    again = resume_plans(cfg, ["spot01"], None, store, now=1000.0 + cfg.resume_timeout + 1)  # long after: a new boot
    assert [p.nodes for p in again] == [("spot01",)]


def test_suspend_forgets_the_nodes_and_ends_their_instances(tmp_path):
    cfg = config(tmp_path)
    store = Store(cfg.state_dir)
    resume_plans(cfg, ["spot01", "spot02"], None, store, now=1.0)
    with store.update() as state:
        state.nodes["spot01"].instance_id = "i-1"
    plans = release_plans(cfg, ["spot01", "spot02"], store, now=2.0, failed=False)
    assert [(p.op, p.nodes, p.instance_ids) for p in plans] == [("terminate", ("spot01", "spot02"), ("i-1",))]
    assert store.read().nodes == {}
    failed = release_plans(cfg, ["od01"], store, now=3.0, failed=True)
    assert failed[0].op == "failed" and "ResumeTimeout" in failed[0].reason


def test_run_program_reads_slurm_resume_file(tmp_path, monkeypatch):
    cfg = config(tmp_path)
    f = tmp_path / "resume.json"
    f.write_text(RESUME)
    monkeypatch.setenv("SLURM_RESUME_FILE", str(f))
    plans = run_program("resume", "spot[01,03],od01", cfg, None, spawn=False, now=5.0)
    assert [p.job_id for p in plans] == ["140814", "140815"]
    with pytest.raises(UserInputError):
        run_program("resume", "spot[01", cfg, None, spawn=False)


def test_config_from_the_example_spec(tmp_path):
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[3] / "examples" / "clusters" / "elastic.yaml")
    assert [p.name for p in cfg.pools] == ["spot", "ondemand"] and cfg.pool_of("spot16").market == "spot"
    assert cfg.pool("spot").instance_types == ("p5.48xlarge", "p5e.48xlarge") and cfg.resume_timeout == 450
    with pytest.raises(UserInputError) as exc:
        config_from_context({"cluster_name": "x", "power": None})
    assert exc.value.exit_code == 2
    with pytest.raises(UserInputError):
        load_config(tmp_path / "missing.json")


def test_the_cli_refuses_a_missing_config_in_one_line(tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "gpuhpc", "power", "resume", "spot01", "--config",
                          str(tmp_path / "none.json")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "GPUHPC_ELASTIC_CONFIG" in res.stderr, res.stderr


def test_repeated_boot_failures_protect_the_pool_until_unprotect(tmp_path):
    from gpuhpc.elastic.config import ElasticConfig, Pool
    from gpuhpc.elastic.reconcile import unprotect
    from gpuhpc.elastic.store import Store
    from gpuhpc.elastic.worker import launch, protect
    from gpuhpc.slurm.power import PowerNode

    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path), protect_after=3,
                        pools=(Pool("spot", ("s1", "s2"), "local", market="spot"),))
    slurm = RecordingSlurm([PowerNode("s1", "IDLE+CLOUD+POWERED_DOWN"), PowerNode("s2", "ALLOCATED+CLOUD")])
    store = Store(tmp_path)
    assert not protect(cfg, slurm, store, "spot", ("s1",), 1.0)
    assert not protect(cfg, slurm, store, "spot", ("s1",), 2.0)
    assert slurm.calls == []
    assert protect(cfg, slurm, store, "spot", ("s1",), 3.0)
    (kind, nodes, reason), = slurm.calls
    assert (kind, nodes) == ("down", "s1") and "3 boot failures in a row" in reason       # s2 runs a job
    assert "gpuhpc power unprotect spot" in reason and store.read().protected["spot"]["failures"] == 3
    # a launch into the protected pool sets its nodes DOWN and launches nothing
    from gpuhpc.elastic.power import Plan

    slurm.calls.clear()
    launch(cfg, slurm, store, Plan("launch", "spot", ("s1",), "tok"), 4.0)
    assert [c[0] for c in slurm.calls] == ["down"] and not (tmp_path / "local").exists()
    slurm.node_list = [PowerNode("s1", "IDLE+CLOUD+DOWN+POWERED_DOWN", reason)]
    slurm.calls.clear()
    assert unprotect(cfg, "spot", slurm) == ["s1"] and slurm.calls == [("resume", "s1")]
    assert not store.read().protected and not store.read().boot_failures
