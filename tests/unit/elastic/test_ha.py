"""Two controllers (issue 38.1): which reconciler acts (gpuhpc.elastic.ha on recorded ``scontrol
ping`` output), a standby's pass that touches nothing, and records taken from Slurm's node
Comment or the provider's tags when the local state.json lost them (a failover)."""
from __future__ import annotations

from gpuhpc.elastic import ha
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.elastic.reconcile import Action, adoptions, apply, decide, reconcile_once
from gpuhpc.elastic.store import NodeRecord, State, Store
from gpuhpc.slurm.commands import scontrol_ping
from gpuhpc.slurm.parsers import ControllerPing, parse_ping
from gpuhpc.slurm.power import PowerNode

# Slurm 22.05.8's scontrol ping (src/scontrol/scontrol.c: "Slurmctld(%s) at %s is %s"), as the
# shared cluster prints it (SlurmctldHost=localhost is printed as the short host name) ...
ONE = "Slurmctld(primary) at vm is UP\n"
# ... and with a backup: both answer (a standby backup answers pings), the primary is in charge
TWO = "Slurmctld(primary) at ctl1 is UP\nSlurmctld(backup) at host2 is UP\n"
# the primary gone: the backup has taken over; scontrol adds a banner and exits 1
FAILED_OVER = ("Slurmctld(primary) at ctl1 is DOWN\nSlurmctld(backup) at host2 is UP\n"
               "*****************************************\n** RESTORE SLURMCTLD DAEMON TO SERVICE **\n"
               "*****************************************\n")
THREE = "Slurmctld(primary) at ctl1 is DOWN\nSlurmctld(backup1) at ctl2 is DOWN\nSlurmctld(backup2) at ctl3.example.org is UP\n"

CFG = ElasticConfig(cluster="c", state_dir="/nonexistent", orphan_grace=600, resume_timeout=120,
                    pools=(Pool("spot", ("s1", "s2", "s3"), "local", market="spot", boot_timeout=60),))
NOW = 10_000.0


def test_scontrol_ping_parses_with_and_without_a_backup():
    assert scontrol_ping() == ["scontrol", "ping"]
    assert parse_ping(ONE) == [ControllerPing("primary", "vm", True)]
    assert parse_ping(TWO) == [ControllerPing("primary", "ctl1", True), ControllerPing("backup", "host2", True)]
    assert parse_ping(FAILED_OVER) == [ControllerPing("primary", "ctl1", False), ControllerPing("backup", "host2", True)]
    assert [c.role for c in parse_ping(THREE)] == ["primary", "backup1", "backup2"]
    assert parse_ping("") == parse_ping("scontrol: error: something\n") == []


def test_only_the_controller_in_charge_acts():
    assert ha.verdict(parse_ping(ONE), "vm").acts
    assert ha.verdict(parse_ping(ONE), "vm.cluster.local").acts          # short or qualified
    # the backup answers the ping too, but the primary is in charge: the backup does nothing
    standby = ha.verdict(parse_ping(TWO), "host2")
    assert not standby.acts and standby.in_charge == "ctl1"
    assert standby.reason == "host2 is the backup controller; ctl1 (primary) is in charge"
    assert ha.verdict(parse_ping(TWO), "ctl1").acts
    # failed over: the backup acts, the old primary (should it run a pass) does not
    assert ha.verdict(parse_ping(FAILED_OVER), "host2").acts
    assert not ha.verdict(parse_ping(FAILED_OVER), "ctl1").acts
    assert ha.verdict(parse_ping(THREE), "ctl3").acts and not ha.verdict(parse_ping(THREE), "ctl2").acts
    # not a controller at all, no controller up, no answer: nothing
    assert not ha.verdict(parse_ping(TWO), "login1").acts
    assert "no SlurmctldHost" in ha.verdict(parse_ping(TWO), "login1").reason
    assert not ha.verdict(parse_ping("Slurmctld(primary) at ctl1 is DOWN\n"), "ctl1").acts
    assert not ha.verdict([], "ctl1").acts


class _Slurm:
    """What reconcile_once reads from Slurm, recorded; any node update fails the test."""

    def __init__(self, ping, nodes=()):
        self.ping, self.node_list, self.calls = ping, list(nodes), []

    def controllers(self):
        return parse_ping(self.ping)

    def nodes(self, names=None):
        return self.node_list

    def jobs_on(self, nodes):
        return []

    def restarts(self, job):
        return 0

    def __getattr__(self, name):           # down, drain, power_down, resume, update, signal_job ...
        def call(*a, **kw):
            self.calls.append((name, a))
            return True
        return call


class _Provider:
    def __init__(self, instances):
        self.live, self.ended = list(instances), []

    def instances(self):
        return self.live

    def terminate(self, ids):
        self.ended += ids
        return ids


def _cfg(tmp_path):
    return ElasticConfig(cluster="c", state_dir=str(tmp_path), orphan_grace=600, resume_timeout=120,
                         pools=CFG.pools)


def test_a_backup_controller_terminates_nothing_it_does_not_know(tmp_path):
    """The standby's state.json is empty; every instance is the primary's. Its pass ends nothing,
    sets no node, writes no record."""
    cfg = _cfg(tmp_path)
    old = [Instance(f"i-{n}", n, "spot", "running", NOW - 5000) for n in ("s1", "s2")]
    provider = _Provider(old)
    slurm = _Slurm(TWO, [PowerNode("s1", "ALLOCATED+CLOUD"), PowerNode("s2", "IDLE+CLOUD")])
    acts = reconcile_once(cfg, slurm, {"local": provider}, now=NOW, host="host2")
    assert acts == [Action("standby", "ctl1", "host2 is the backup controller; ctl1 (primary) is in charge")]
    assert provider.ended == [] and slurm.calls == [] and not (tmp_path / "state.json").exists()
    # the same pass on the primary, with records: nothing to do either
    with Store(tmp_path).update() as state:
        for i in old:
            state.nodes[i.node] = NodeRecord(i.node, "spot", "t", NOW - 5000, i.id, NOW - 5000)
    assert reconcile_once(cfg, slurm, {"local": provider}, now=NOW, host="ctl1") == []


def test_a_primary_with_no_records_adopts_the_instances_slurm_names_and_ends_none(tmp_path):
    """A failover (or a lost state.json): the node's Comment (written at launch) names its
    instance; the pass records it instead of terminating it as an orphan."""
    cfg = _cfg(tmp_path)
    a = Instance("i-a", "s1", "spot", "running", NOW - 5000)
    b = Instance("i-b", "s2", "spot", "running", NOW - 5000)           # its Comment not written yet
    stray = Instance("i-x", "s3", "spot", "running", NOW - 5000)       # s3 powered down: an orphan
    provider = _Provider([a, b, stray])
    slurm = _Slurm(ONE, [PowerNode("s1", "ALLOCATED+CLOUD", comment="gpuhpc instance i-a pool spot type local"),
                         PowerNode("s2", "IDLE+CLOUD+POWERING_UP"),
                         PowerNode("s3", "IDLE+CLOUD+POWERED_DOWN", comment="gpuhpc instance i-x pool spot type local")])
    acts = reconcile_once(cfg, slurm, {"local": provider}, now=NOW, host="vm")
    assert [(x.kind, x.target, x.reason) for x in acts if x.kind == "adopt"] == [("adopt", "s1", "i-a"), ("adopt", "s2", "i-b")]
    assert provider.ended == ["i-x"]
    state = Store(tmp_path).read()
    assert {n: r.instance_id for n, r in state.nodes.items()} == {"s1": "i-a", "s2": "i-b"}
    assert state.nodes["s1"].launched_at == NOW - 5000 and state.nodes["s1"].pool == "spot"
    # the next pass finds everything in line
    provider.live = [a, b]
    assert reconcile_once(cfg, slurm, {"local": provider}, now=NOW + 60, host="vm") == []


def test_a_stale_record_yields_to_the_instance_slurm_names():
    """The other controller relaunched s1 while this one was standby: its record names i-old (gone),
    Slurm's Comment i-new (live). Adopted, not set DOWN as 'instance gone'."""
    new = Instance("i-new", "s1", "spot", "running", NOW - 100)
    state = State(nodes={"s1": NodeRecord("s1", "spot", "t", NOW - 9000, "i-old", NOW - 9000)})
    nodes = [PowerNode("s1", "ALLOCATED+CLOUD", comment="gpuhpc instance i-new pool spot type local")]
    acts = decide(CFG, nodes, [new], state, NOW)
    assert [(a.kind, a.target, a.reason) for a in acts] == [("adopt", "s1", "i-new")]


def test_what_is_never_adopted():
    inst = Instance("i-1", "s1", "spot", "running", NOW - 5000)
    comment = "gpuhpc instance i-1 pool spot type local"
    # a launch in flight (a record with no instance yet): the worker will record it
    state = State(nodes={"s1": NodeRecord("s1", "spot", "t", NOW - 5)})
    assert adoptions(CFG, [PowerNode("s1", "IDLE+CLOUD+POWERING_UP", comment=comment)], [inst], state, NOW) == {}
    # a node powered down or powering down: its Comment is its last instance's
    for flags in ("IDLE+CLOUD+POWERED_DOWN", "IDLE+CLOUD+POWERING_DOWN"):
        assert adoptions(CFG, [PowerNode("s1", flags, comment=comment)], [inst], State(), NOW) == {}
    # an instance a suspend is ending, one another record holds, one tagged for another node
    assert adoptions(CFG, [PowerNode("s1", "IDLE+CLOUD", comment=comment)], [inst],
                     State(releasing={"i-1": NOW - 10}), NOW) == {}
    held = State(nodes={"s2": NodeRecord("s2", "spot", "t", NOW, "i-1", NOW)})
    assert adoptions(CFG, [PowerNode("s1", "IDLE+CLOUD", comment=comment)], [inst], held, NOW) == {}
    other = Instance("i-1", "s2", "spot", "running", NOW - 5000)
    assert adoptions(CFG, [PowerNode("s1", "IDLE+CLOUD", comment=comment)], [other], State(), NOW) == {}
    # no Comment and two instances tagged for the node: which one is not Slurm's to say
    twins = [Instance("i-1", "s1", "spot", "running", NOW), Instance("i-2", "s1", "spot", "running", NOW)]
    assert adoptions(CFG, [PowerNode("s1", "IDLE+CLOUD")], twins, State(), NOW) == {}
    # a node that lost its machine (its record's instance gone) with a stray instance tagged for it
    # (the chaos run's orphan): the stray is no replacement; the node goes DOWN, the stray is an orphan
    stray = Instance("i-stray", "s1", "spot", "running", NOW - 5000)
    lost = State(nodes={"s1": NodeRecord("s1", "spot", "t", NOW - 9000, "i-old", NOW - 9000)})
    old_comment = "gpuhpc instance i-old pool spot type local"
    assert adoptions(CFG, [PowerNode("s1", "ALLOCATED+CLOUD", comment=old_comment)], [stray], lost, NOW) == {}
    acts = decide(CFG, [PowerNode("s1", "ALLOCATED+CLOUD", comment=old_comment)], [stray], lost, NOW)
    assert [(a.kind, a.target) for a in acts] == [("terminate", "i-stray"), ("down", "s1"), ("power_down", "s1"),
                                                  ("forget", "s1")]
    # ... and the pass after (record forgotten, node not yet powering down): still no adoption
    assert adoptions(CFG, [PowerNode("s1", "DOWN+CLOUD", comment=old_comment)], [stray], State(), NOW) == {}
    # a terminated instance named in the Comment: nothing (the node's instance is gone)
    dead = Instance("i-1", "s1", "spot", "terminated", NOW - 5000)
    assert adoptions(CFG, [PowerNode("s1", "IDLE+CLOUD", comment=comment)], [dead], State(), NOW) == {}


def test_apply_keeps_a_record_a_resume_wrote_meanwhile(tmp_path):
    cfg = _cfg(tmp_path)
    store = Store(tmp_path)
    with store.update() as state:          # the resume program, after the pass read the state
        state.nodes["s1"] = NodeRecord("s1", "spot", "fresh", NOW + 1)
    apply(cfg, [Action("adopt", "s1", "i-1", NOW - 50), Action("adopt", "s2", "i-2", NOW - 50)],
          _Slurm(ONE), store, {}, NOW)
    nodes = store.read().nodes
    assert nodes["s1"].token == "fresh" and nodes["s1"].instance_id is None
    assert nodes["s2"].instance_id == "i-2" and nodes["s2"].token == "adopted" and nodes["s2"].job_started


def test_apply_never_replaces_a_launch_recorded_since_the_pass_read_the_state(tmp_path):
    """The chaos run's lost instance: the pass saw s1's record naming a gone instance and adopted
    the one its Comment named; meanwhile the worker relaunched s1 and recorded the new instance
    (requested before the pass). Writing the adoption over it left the new instance named by no
    record, and a later pass ended it as an orphan. Only the very record the pass saw is replaced."""
    cfg = _cfg(tmp_path)
    store = Store(tmp_path)
    with store.update() as state:
        state.nodes["s1"] = NodeRecord("s1", "spot", "relaunch", NOW - 30, instance_id="i-new", launched_at=NOW - 5)
        state.nodes["s2"] = NodeRecord("s2", "spot", "old", NOW - 900, instance_id="i-gone", launched_at=NOW - 890)
    apply(cfg, [Action("adopt", "s1", "i-1", NOW - 50, was="i-gone"),      # the pass saw i-gone on s1
                Action("adopt", "s2", "i-2", NOW - 50, was="i-gone")],     # s2 is as the pass saw it
          _Slurm(ONE), store, {}, NOW)
    nodes = store.read().nodes
    assert nodes["s1"].instance_id == "i-new" and nodes["s1"].token == "relaunch"
    assert nodes["s2"].instance_id == "i-2" and nodes["s2"].token == "adopted"
