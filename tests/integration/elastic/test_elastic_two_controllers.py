"""Two controllers and max_nodes (issue 38.1 and 38.4) on the elastic scenarios' private controller
(conftest.py's ``elastic`` fixture, the local provider).

The backup controller: the same running slurmctld seen through a copy of its slurm.conf that
names two SlurmctldHosts, another host first (the primary, in charge) and this host second, both
at 127.0.0.1: ``scontrol ping`` there says what it says on a real backup (both answer; the
primary is in charge), and the reconciler runs unchanged, as the backup's timer would. Its local
state knows nothing (the records live on the primary): it must end nothing. The primary whose
state.json is lost (a failover to a controller that never saw the launch) takes the record from
the node's Comment and ends nothing; the node's suspend then ends that very instance.

The file sorts after test_elastic_scenarios.py on purpose: the scale-up scenario reads the
package cluster's whole instance journal and expects its spot instance to be the first."""
from __future__ import annotations

import dataclasses
import json
import socket

import pytest

from gpuhpc.elastic.power import CAP_REASON
from gpuhpc.elastic.reconcile import reconcile_once
from gpuhpc.elastic.store import Store
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.power import PowerSlurm
from gpuhpc.transport.local import LocalRunner
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]       # a private controller only

PRIMARY = "gpuhpc-el-primary"          # a name no resolver knows: its address is given


def _as_backup(el) -> PowerSlurm:
    """PowerSlurm through a slurm.conf in which this host is the backup controller."""
    me = socket.gethostname().split(".")[0]
    lines = el.conf.read_text().splitlines()
    conf = [f"SlurmctldHost={PRIMARY}(127.0.0.1)\nSlurmctldHost={me}(127.0.0.1)" if line.startswith("SlurmctldHost=")
            else line for line in lines]
    path = el.base / "slurm-as-backup.conf"
    path.write_text("\n".join(conf) + "\n")
    return PowerSlurm(SlurmClient(LocalRunner(env={**el.env, "SLURM_CONF": str(path)}), timeout=20))


def _reconcile(el, slurm, now=None, config=None):
    """One reconciler pass as a timer runs it, through ``slurm`` (its slurm.conf: which controller)."""
    return reconcile_once(config or el.config, slurm, {"local": el.provider}, now=now)


def _actions(acts):
    return [(a.kind, a.target) for a in acts]


def test_the_backup_ends_nothing_and_a_failover_loses_no_record(elastic):
    el = elastic
    job = el.submit("spot", seconds=300)
    el.mark(f"job {job} submitted to spot")

    node_name = wait_for(lambda: (el.job(job).get("NodeList") or "").startswith("el-spot") and el.job(job)["NodeList"],
                         30, f"job {job} to be given a spot node")

    def launched():
        node = el.node(node_name)
        live = {i.id: i for i in el.provider.instances()}
        iid = node.comment.split()[2] if node and node.comment.startswith("gpuhpc instance ") else None
        rec = Store(el.config.state_dir).read().nodes.get(node_name)
        return iid in live and rec is not None and rec.instance_id == iid and live[iid]
    inst = wait_for(launched, 60, lambda: f"{node_name}'s instance launched and named in its Comment ({el.node(node_name)})")
    el.mark(f"{node_name} {el.state(node_name)}: {el.node(node_name).comment}")

    # the records are the primary's: the backup's state_dir never saw this launch
    state_json = Store(el.config.state_dir).path
    saved = state_json.read_text()
    state_json.write_text("{}")
    late = inst.launched_at + el.config.orphan_grace + 3600          # long past the orphan grace
    backup = _as_backup(el)
    pings = [(c.role, c.up) for c in backup.controllers()]
    assert pings == [("primary", True), ("backup", True)], pings
    acts = _reconcile(el, backup, now=late)
    el.mark(f"reconcile on the backup at +{late - inst.launched_at:.0f}s: {_actions(acts)}")
    assert "terminate" not in [a.kind for a in acts], acts
    assert inst.id in [i.id for i in el.provider.instances()]
    assert Store(el.config.state_dir).read().nodes == {}             # nor did it write anything
    assert "DOWN" not in el.node(node_name).flags

    # failover: the controller in charge has lost the records; Slurm's Comment has the truth
    acts = el.reconcile(now=late)
    el.mark(f"reconcile on the primary with no records: {_actions(acts)}")
    assert ("adopt", node_name) in _actions(acts) and "terminate" not in [a.kind for a in acts], acts
    assert inst.id in [i.id for i in el.provider.instances()]
    rec = Store(el.config.state_dir).read().nodes[node_name]
    assert (rec.instance_id, rec.pool) == (inst.id, "spot")
    assert el.job(job).get("JobState") in ("CONFIGURING", "RUNNING"), el.job(job)
    assert json.loads(saved)["nodes"][node_name]["instance_id"] == inst.id       # what was lost

    # the adopted record is a record: the node's suspend ends exactly that instance
    el.client.run(["scancel", job], check=False)
    wait_for(lambda: inst.id not in [i.id for i in el.provider.instances()], 90,
             lambda: f"the suspend of {node_name} to end {inst.id} ({node_name} {el.state(node_name)})")
    el.mark(f"job {job} cancelled; {node_name} {el.state(node_name)}, {inst.id} ended by its suspend")


def test_a_launch_past_max_nodes_is_refused_with_the_reason_on_the_node(elastic):
    """spot capped at one node: of two single-node jobs, the second's node goes DOWN at once with
    the cap's reason (the job requeues and waits); the first runs."""
    el = elastic
    path = el.base / "elastic.json"
    original = path.read_text()
    ctx = json.loads(original)
    for g in ctx["power"]["groups"]:
        if g["name"] == "spot":
            g["max_nodes"] = 1
    path.write_text(json.dumps(ctx))                   # what the power programs read at each run
    capped = dataclasses.replace(el.config, pools=tuple(dataclasses.replace(p, max_nodes=1) if p.name == "spot" else p
                                                        for p in el.config.pools))
    jobs = []
    try:
        jobs = [el.submit("spot", seconds=300), el.submit("spot", seconds=300)]
        el.mark(f"jobs {jobs} submitted to spot (max_nodes 1)")

        def refused():
            nodes = el.slurm.nodes("el-spot[1-2]")
            return [n for n in nodes if "DOWN" in n.flags and n.reason.startswith(CAP_REASON)]
        (node,) = wait_for(refused, 60, lambda: f"a spot node DOWN for max_nodes ({el.slurm.nodes('el-spot[1-2]')})")
        el.mark(f"{node.name} {node.state}: {node.reason}")
        assert node.reason.startswith(f"{CAP_REASON} pool spot: 1 of 1 in use, 1 more asked"), node.reason
        other = "el-spot1" if node.name == "el-spot2" else "el-spot2"
        records = Store(el.config.state_dir).read().nodes
        assert sorted(records) == [other], records                      # one launch, one record
        assert len([i for i in el.provider.instances() if i.pool == "spot"]) == 1
        # the reconciler keeps it DOWN while the pool is full
        acts = _reconcile(el, el.slurm, config=capped)
        assert (node.name not in [a.target for a in acts if a.kind in ("resume", "power_down")]), acts
        # the job that got the refused node was requeued: it waits, on no node
        states = wait_for(lambda: (lambda s: node.name not in s.values() and s)(
            {j: el.job(j).get("NodeList") for j in jobs}), 30, f"no job on {node.name}")
        el.mark(f"jobs on {states}")
    finally:
        path.write_text(original)
        for j in jobs:
            el.client.run(["scancel", j], check=False)
