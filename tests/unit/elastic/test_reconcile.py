"""The reconciler's decision table (gpuhpc.elastic.reconcile.decide), pure: nodes, instances,
records and a clock in; actions out."""
from __future__ import annotations

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.elastic.reconcile import Action, decide
from gpuhpc.elastic.store import NodeRecord, State
from gpuhpc.slurm.power import PowerNode, parse_jobs_on_nodes, parse_power_nodes

CFG = ElasticConfig(cluster="c", state_dir="/nonexistent", orphan_grace=600, resume_timeout=120,
                    pools=(Pool("spot", ("s1", "s2", "s3"), "local", market="spot", boot_timeout=60,
                                capacity_cooldown=300),
                           Pool("od", ("o1",), "local", price_tier=2)))
NOW = 10_000.0


def inst(iid, node=None, launched=NOW - 1000, state="running", interrupted=None):
    return Instance(id=iid, node=node, pool="spot", state=state, launched_at=launched, interrupted_at=interrupted)


def rec(node, iid=None, requested=NOW - 1000, launched=None):
    return NodeRecord(node=node, pool="spot", token="t", requested_at=requested, instance_id=iid,
                      launched_at=launched if launched is not None else (requested if iid else None))


def node(name, state="IDLE+CLOUD", reason=""):
    return PowerNode(name, state, reason)


def run(nodes=(), instances=(), records=(), cooldowns=None, interrupted=None, jobs_on=None, now=NOW):
    state = State(nodes={r.node: r for r in records}, cooldowns=cooldowns or {}, interrupted=interrupted or {})
    return decide(CFG, list(nodes), list(instances), state, now, jobs_on or {})


def test_all_in_line_does_nothing():
    assert run([node("s1", "ALLOCATED+CLOUD")], [inst("i-1", "s1")], [rec("s1", "i-1")]) == []


def test_an_orphan_is_terminated_after_its_grace_and_never_before():
    young = inst("i-9", "s2", launched=NOW - 599)
    old = inst("i-8", "s3", launched=NOW - 600)
    assert run(instances=[young]) == []
    assert run(instances=[old]) == [Action("terminate", "i-8", "orphan for 600s (grace 600s)")]
    # a recorded instance is never an orphan, however old
    assert run([node("s3")], [inst("i-8", "s3", launched=0)], [rec("s3", "i-8")]) == []


def test_a_terminated_instance_is_no_orphan():
    assert run(instances=[inst("i-7", state="terminated", launched=0)]) == []


def test_a_node_whose_instance_is_gone_goes_down_then_powers_down():
    acts = run([node("s1", "ALLOCATED+CLOUD")], [], [rec("s1", "i-1")])
    assert [a.kind for a in acts] == ["down", "power_down", "forget"]
    assert "instance i-1 is gone" in acts[0].reason


def test_a_just_launched_instance_the_provider_does_not_list_yet_is_left_alone():
    r = rec("s1", "i-1", requested=NOW - 5)
    assert run([node("s1", "IDLE+CLOUD+POWERING_UP")], [], [r]) == []


def test_a_gone_instance_of_a_powered_down_node_is_only_forgotten():
    assert [a.kind for a in run([node("s1", "IDLE+CLOUD+POWERED_DOWN")], [], [rec("s1", "i-1")])] == ["forget"]


def test_a_launch_that_never_produced_an_instance_is_stuck_after_resume_timeout():
    assert run([node("s1", "IDLE+CLOUD+POWERING_UP")], [], [rec("s1", requested=NOW - 100)]) == []
    acts = run([node("s1", "IDLE+CLOUD+POWERING_UP")], [], [rec("s1", requested=NOW - 121)])
    assert [(a.kind, a.target) for a in acts] == [("down", "s1"), ("power_down", "s1"), ("forget", "s1")]
    assert "stuck powering up" in acts[0].reason


def test_a_spot_interruption_drains_and_signals_first_then_downs_after_the_window():
    i = inst("i-1", "s1", interrupted=NOW - 1)
    first = run([node("s1", "ALLOCATED+CLOUD")], [i], [rec("s1", "i-1")], jobs_on={"s1": ["77"]})
    assert [(a.kind, a.target) for a in first] == [("drain", "s1"), ("signal", "77"), ("note_interrupt", "s1")]
    assert first[1].reason == "USR2"
    waiting = run([node("s1", "MIXED+DRAIN+CLOUD")], [i], [rec("s1", "i-1")], interrupted={"s1": NOW - 10})
    assert waiting == []
    later = run([node("s1", "MIXED+DRAIN+CLOUD")], [i], [rec("s1", "i-1")], interrupted={"s1": NOW - 30})
    assert [(a.kind, a.target) for a in later] == [("down", "s1"), ("power_down", "s1"), ("terminate", "i-1"),
                                                    ("forget", "s1")]


def test_a_cooldown_ends_and_its_nodes_return_to_the_pool():
    reason = "gpuhpc cooldown InsufficientInstanceCapacity pool spot until 10:00:00"
    nodes = [node("s1", "DOWN+CLOUD+POWERED_DOWN", reason), node("s2", "DOWN+CLOUD", reason),
             node("s3", "DOWN+CLOUD", "someone else's reason")]
    cd = {"spot": {"until": NOW + 1, "code": "InsufficientInstanceCapacity"}}
    assert run(nodes, cooldowns=cd) == []
    cd["spot"]["until"] = NOW
    acts = run(nodes, cooldowns=cd)
    assert [(a.kind, a.target) for a in acts] == [("end_cooldown", "spot"), ("resume", "s1"), ("power_down", "s2")]


def test_a_cooldown_waits_for_slurm_to_give_up_on_a_failed_launch():
    reason = "gpuhpc cooldown InsufficientInstanceCapacity pool spot until 10:00:00"
    nodes = [node("s1", "DOWN+CLOUD+NOT_RESPONDING+POWERING_UP", reason), node("s2", "DOWN+CLOUD+POWERED_DOWN", reason)]
    assert run(nodes, cooldowns={"spot": {"until": NOW - 5, "code": "x"}}) == []


def test_one_pass_over_many_nodes_decides_each_once():
    records = [rec(f"s{i}", f"i-{i}") for i in range(1, 4)]
    acts = run([node("s1"), node("s2"), node("s3")], [inst("i-1", "s1"), inst("i-x", None, launched=0)], records)
    assert sorted((a.kind, a.target) for a in acts) == sorted([
        ("terminate", "i-x"), ("down", "s2"), ("power_down", "s2"), ("forget", "s2"),
        ("down", "s3"), ("power_down", "s3"), ("forget", "s3")])


def test_scontrol_node_records_and_squeue_rows_parse():
    text = ("NodeName=s1 Arch=x86_64 State=IDLE+CLOUD+POWERED_DOWN ThreadsPerCore=1 Comment=(null) "
            "Reason=gpuhpc cooldown X pool spot until 10:00:00 [root@2026-12-01T12:00:00]\n"
            "NodeName=s2 State=ALLOCATED+CLOUD Comment=gpuhpc instance i-2 pool spot type local Reason=(null)\n")
    nodes = parse_power_nodes(text)
    assert nodes[0].flags == {"IDLE", "CLOUD", "POWERED_DOWN"} and nodes[0].reason.startswith("gpuhpc cooldown X pool spot until 10:00:00")
    assert nodes[0].comment == "" and nodes[1].comment == "gpuhpc instance i-2 pool spot type local" and nodes[1].reason == ""
    assert parse_jobs_on_nodes("12|s[1-2]\n\n13|s3\n") == [("12", "s[1-2]"), ("13", "s3")]


def test_a_job_past_its_restart_budget_is_held_when_its_node_goes_down():
    budget = CFG.pool("spot").restart_budget
    gone = ([node("s1", "ALLOCATED+CLOUD")], [], [rec("s1", "i-1")])
    state = State(nodes={"s1": rec("s1", "i-1")})
    under = decide(CFG, *gone[:2], state, NOW, {"s1": ["77"]}, restarts={"77": budget - 1})
    assert [a.kind for a in under] == ["down", "power_down", "forget"]
    spent = decide(CFG, *gone[:2], state, NOW, {"s1": ["77"]}, restarts={"77": budget})
    assert [(a.kind, a.target) for a in spent][-1] == ("hold", "77")
    assert f"restart budget {budget} spent" in spent[-1].reason and "scontrol release 77" in spent[-1].reason


def test_a_good_boot_resets_the_boot_failures_and_a_protected_pool_keeps_its_cooldown():
    up = [node("s1", "ALLOCATED+CLOUD")]
    state = State(nodes={"s1": rec("s1", "i-1")}, boot_failures={"spot": 2})
    assert [(a.kind, a.target) for a in decide(CFG, up, [inst("i-1", "s1")], state, NOW)] == [("boot_ok", "spot")]
    booting = [node("s1", "ALLOCATED+CLOUD+POWERING_UP")]
    assert decide(CFG, booting, [inst("i-1", "s1")], state, NOW) == []
    cooled = [node("s2", "IDLE+CLOUD+DOWN+POWERED_DOWN", "gpuhpc cooldown boot-timeout pool spot until 1")]
    over = {"spot": {"until": NOW - 1, "code": "boot-timeout"}}
    assert [a.kind for a in decide(CFG, cooled, [], State(cooldowns=over), NOW)] == ["end_cooldown", "resume"]
    protected = State(cooldowns=over, protected={"spot": {"since": 0, "failures": 3}}, boot_failures={"spot": 3})
    assert decide(CFG, cooled, [], protected, NOW) == []


def test_an_instance_a_suspend_is_ending_is_no_orphan_for_its_grace():
    old = inst("i-8", "s3", launched=NOW - 5000)
    releasing = State(releasing={"i-8": NOW - 1})
    assert decide(CFG, [], [old], releasing, NOW) == []
    stale = State(releasing={"i-8": NOW - 600})          # its worker died: the orphan rule again
    assert [a.kind for a in decide(CFG, [], [old], stale, NOW)] == ["terminate"]


def test_an_instance_failing_status_checks_is_replaced_and_its_job_counted():
    """Issue 38.7: an instance EC2 reports impaired is ended and its node goes DOWN then powers
    down (the job requeues, Slurm resumes the node on a new instance), as ParallelCluster replaces
    unhealthy instances; a node already powering down is left to its suspend."""
    from dataclasses import replace

    bad = replace(inst("i-1", "s1"), impaired="system")
    acts = run([node("s1", "ALLOCATED+CLOUD")], [bad, inst("i-2", "s2")], [rec("s1", "i-1"), rec("s2", "i-2")],
               jobs_on={"s1": ["77"]})
    assert [(a.kind, a.target) for a in acts] == [("down", "s1"), ("power_down", "s1"), ("terminate", "i-1"),
                                                   ("forget", "s1")]
    assert acts[0].reason == "gpuhpc: instance i-1 failed EC2 system status checks"
    assert run([node("s1", "IDLE+CLOUD+POWERING_DOWN")], [bad], [rec("s1", "i-1")]) == []
