"""A pool's ``max_nodes`` (issue 38.4): the resume program refuses a launch past it (whole: every
pool of the job), the worker sets the refused nodes and the pool's idle ones DOWN with the reason,
and the reconciler returns them as room frees up."""
from __future__ import annotations

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.power import CAP_REASON, resume_plans
from gpuhpc.elastic.reconcile import decide
from gpuhpc.elastic.store import NodeRecord, State, Store
from gpuhpc.elastic.worker import release, run_plans
from gpuhpc.slurm.power import PowerNode

from .fakes import RecordingSlurm


def config(tmp_path, cap=2) -> ElasticConfig:
    return ElasticConfig(cluster="c", state_dir=str(tmp_path), resume_timeout=120, pools=(
        Pool("spot", ("s1", "s2", "s3", "s4"), "local", market="spot", max_nodes=cap),
        Pool("od", ("o1", "o2"), "local", price_tier=2)))          # max_nodes 0: no cap


def test_a_launch_past_max_nodes_is_refused_with_the_reason_and_records_nothing(tmp_path):
    cfg = config(tmp_path)
    store = Store(tmp_path)
    first = resume_plans(cfg, ["s1", "s2"], None, store, now=100.0)
    assert [(p.op, p.nodes, p.each) for p in first] == [("launch", ("s1", "s2"), True)]   # one batch
    refused = resume_plans(cfg, ["s3"], None, store, now=101.0)
    assert [(p.op, p.pool, p.nodes) for p in refused] == [("refuse", "spot", ("s3",))]
    assert refused[0].reason == f"{CAP_REASON} pool spot: 2 of 2 in use, 1 more asked"
    assert sorted(store.read().nodes) == ["s1", "s2"]
    # a pool with no cap launches anything
    assert [(p.op, p.nodes) for p in resume_plans(cfg, ["o1", "o2"], None, store, now=102.0)] == [
        ("launch", ("o1", "o2"))]


def test_a_job_is_refused_whole_when_it_does_not_fit(tmp_path):
    """One job's nodes come up all or nothing: a job asking 3 nodes of a pool capped at 2 gets
    none, and a job spanning two pools gets none of either when one is full."""
    cfg = config(tmp_path)
    store = Store(tmp_path)
    import json

    three = json.dumps({"jobs": [{"job_id": 7, "nodes": "s[1-3]"}], "all_nodes": "s[1-3]"})
    plans = resume_plans(cfg, ["s1", "s2", "s3"], three, store, now=100.0)
    assert [(p.op, p.nodes, p.job_id) for p in plans] == [("refuse", ("s1", "s2", "s3"), "7")]
    assert "0 of 2 in use, 3 more asked" in plans[0].reason and store.read().nodes == {}
    resume_plans(cfg, ["s1", "s2"], None, store, now=101.0)
    both = json.dumps({"jobs": [{"job_id": 8, "nodes": "s3,o1"}], "all_nodes": "s3,o1"})
    plans = resume_plans(cfg, ["s3", "o1"], both, store, now=102.0)
    assert sorted((p.op, p.pool) for p in plans) == [("refuse", "od"), ("refuse", "spot")]
    assert sorted(store.read().nodes) == ["s1", "s2"]


def test_a_suspend_frees_room(tmp_path):
    from gpuhpc.elastic.power import release_plans

    cfg = config(tmp_path)
    store = Store(tmp_path)
    resume_plans(cfg, ["s1", "s2"], None, store, now=100.0)
    release_plans(cfg, ["s1"], store, now=200.0, failed=False)
    assert [p.op for p in resume_plans(cfg, ["s3"], None, store, now=201.0)] == ["launch"]


def test_the_worker_sets_the_refused_nodes_and_the_idle_rest_of_the_pool_down_with_the_reason(tmp_path):
    cfg = config(tmp_path)
    store = Store(tmp_path)
    resume_plans(cfg, ["s1", "s2"], None, store, now=100.0)
    (plan,) = resume_plans(cfg, ["s3"], None, store, now=101.0)
    slurm = RecordingSlurm([PowerNode("s1", "ALLOCATED+CLOUD"), PowerNode("s2", "IDLE+CLOUD+POWERING_UP"),
                    PowerNode("s3", "IDLE+CLOUD+POWERING_UP"), PowerNode("s4", "IDLE+CLOUD+POWERED_DOWN")])
    run_plans(cfg, [plan], slurm)
    assert slurm.calls == [("down", "s3", plan.reason), ("down", "s4", plan.reason)]
    # Slurm's ResumeTimeout on the refused node runs resume-fail: still full, so DOWN again, not back
    from gpuhpc.elastic.power import release_plans

    slurm.calls.clear()
    (failed,) = release_plans(cfg, ["s3"], store, now=150.0, failed=True)
    release(cfg, slurm, store, failed, 150.0)
    assert slurm.calls == [("down", "s3", f"{CAP_REASON} pool spot: 2 of 2 in use")]
    # ... and back once there is room
    with store.update() as state:
        state.nodes.pop("s1")
    slurm.calls.clear()
    release(cfg, slurm, store, failed, 160.0)
    assert slurm.calls == [("resume", "s3")]


def test_the_reconciler_returns_capped_nodes_as_room_frees_up():
    cfg = ElasticConfig(cluster="c", state_dir="/nonexistent", resume_timeout=120, pools=(
        Pool("spot", ("s1", "s2", "s3", "s4"), "local", market="spot", max_nodes=2),))
    reason = f"{CAP_REASON} pool spot: 2 of 2 in use, 1 more asked"
    capped = [PowerNode("s3", "DOWN+CLOUD+POWERED_DOWN", reason), PowerNode("s4", "DOWN+CLOUD+POWERED_DOWN", reason)]
    up = [PowerNode("s1", "ALLOCATED+CLOUD"), PowerNode("s2", "ALLOCATED+CLOUD")]
    full = State(nodes={n: NodeRecord(n, "spot", "t", 0.0, f"i-{n}", 0.0) for n in ("s1", "s2")})
    from gpuhpc.elastic.providers.base import Instance

    live = [Instance(f"i-{n}", n, "spot", "running", 0.0) for n in ("s1", "s2")]
    assert decide(cfg, up + capped, live, full, 100.0) == []
    half = State(nodes={"s1": full.nodes["s1"]})
    acts = decide(cfg, [up[0], PowerNode("s2", "IDLE+CLOUD+POWERED_DOWN")] + capped, live[:1], half, 100.0)
    assert [(a.kind, a.target) for a in acts] == [("resume", "s3")]          # room for one
    # a capped node Slurm still powers up (ResumeTimeout, resume-fail first) waits; so does a
    # pool cooling down or protected
    waiting = [PowerNode("s3", "DOWN+CLOUD+POWERING_UP", reason)]
    assert decide(cfg, waiting, [], State(), 100.0) == []
    assert decide(cfg, capped, [], State(cooldowns={"spot": {"until": 200.0, "code": "x"}}), 100.0) == []
    assert decide(cfg, capped, [], State(protected={"spot": {"since": 0}}), 100.0) == []
    # not a cap's reason: not the cap's to return
    assert decide(cfg, [PowerNode("s3", "DOWN+CLOUD+POWERED_DOWN", "admin: bad disk")], [], State(), 100.0) == []
