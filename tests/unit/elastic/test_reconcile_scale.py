"""The reconciler at 10,000 nodes (issue 38.3; bench/elastic.py measures it): Slurm commands per
pass do not grow with the nodes (one ``scontrol update`` per kind of change in a reclaim wave, one
``scancel`` for every job to signal, one ``squeue`` for the jobs' requeue counts), and node -> pool
is a lookup, not a scan of every pool's nodes."""
from __future__ import annotations

from collections import Counter

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.elastic.reconcile import REASONS_MAX, generic_reason, reconcile_once
from gpuhpc.elastic.store import NodeRecord, Store
from gpuhpc.slurm.parsers import parse_ping
from gpuhpc.slurm.power import JobBrief, PowerNode, job_briefs_argv, parse_job_briefs

NOW = 1_000_000.0
N = 60                          # more than REASONS_MAX nodes lose their instance in one pass


class CountingSlurm:
    """A primary controller whose ``N`` nodes all run a job; every command is counted."""

    def __init__(self, names, restarts=0):
        self.names, self.restarts_each, self.commands, self.calls = names, restarts, Counter(), []

    def controllers(self):
        return parse_ping("Slurmctld(primary) at ctl is UP\n")

    def nodes(self, names=None):
        self.commands["show node"] += 1
        return [PowerNode(n, "ALLOCATED+CLOUD", comment=f"gpuhpc instance i-{n} pool p type t") for n in self.names]

    def jobs_on(self, expr):
        self.commands["squeue -w"] += 1
        return [(f"{100 + i}", n) for i, n in enumerate(self.names)]

    def job_briefs(self, ids):
        self.commands["squeue --jobs"] += 1
        return {j: JobBrief(j, self.restarts_each, "RUNNING", NOW - 9, NOW - 8) for j in ids}

    def __getattr__(self, name):            # down, drain, power_down, resume, signal_jobs, hold_job ...
        def call(*a, **kw):
            self.commands[name] += 1
            self.calls.append((name, a))
            return True
        return call


class ListProvider:
    def __init__(self, instances):
        self.live, self.ended = instances, []

    def instances(self):
        return self.live

    def terminate(self, ids):
        self.ended += ids
        return ids


def setup(tmp_path, n, interrupted: bool):
    names = [f"c{i:03d}" for i in range(n)]
    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path), orphan_grace=600, resume_timeout=120,
                        pools=(Pool("p", tuple(names), "x", market="spot", restart_budget=3),))
    with Store(tmp_path).update() as state:
        for n_ in names:
            state.nodes[n_] = NodeRecord(n_, "p", "t", NOW - 900, f"i-{n_}", NOW - 900, job_started=True)
    # interrupted: every instance has a spot notice; else every instance is gone
    live = [Instance(f"i-{n_}", n_, "p", "running", NOW - 900, interrupted_at=NOW - 5) for n_ in names] \
        if interrupted else []
    return cfg, names, ListProvider(live)


def test_a_reclaim_wave_is_a_few_slurm_commands_not_one_per_node(tmp_path):
    cfg, names, provider = setup(tmp_path, N, interrupted=False)
    slurm = CountingSlurm(names, restarts=5)          # every job past its budget: held
    acts = reconcile_once(cfg, slurm, {"x": provider}, now=NOW, host="ctl")
    assert Counter(a.kind for a in acts)["down"] == N
    assert slurm.commands["down"] == 1 and slurm.commands["power_down"] == 1, slurm.commands
    assert slurm.commands["squeue --jobs"] == 1 and slurm.commands["squeue -w"] == 1
    (down,) = [a for name, a in slurm.calls if name == "down"]
    assert down[1] == "gpuhpc: instance (see Comment) is gone"


def test_a_few_nodes_keep_their_instance_in_the_reason(tmp_path):
    cfg, names, provider = setup(tmp_path, 3, interrupted=False)
    slurm = CountingSlurm(names)
    reconcile_once(cfg, slurm, {"x": provider}, now=NOW, host="ctl")
    downs = sorted(a[1] for name, a in slurm.calls if name == "down")
    assert downs == [f"gpuhpc: instance i-c00{i} is gone" for i in range(3)]
    assert 3 <= REASONS_MAX


def test_spot_notices_signal_every_job_in_one_scancel(tmp_path):
    cfg, names, provider = setup(tmp_path, N, interrupted=True)
    slurm = CountingSlurm(names)
    reconcile_once(cfg, slurm, {"x": provider}, now=NOW, host="ctl")
    assert slurm.commands["signal_jobs"] == 1 and slurm.commands["drain"] == 1, slurm.commands
    (sig,) = [a for name, a in slurm.calls if name == "signal_jobs"]
    assert sorted(sig[0]) == sorted(f"{100 + i}" for i in range(N)) and sig[1] == "USR2"


def test_generic_reason_drops_only_the_instance_id():
    assert generic_reason("gpuhpc: spot interruption of i-0abc12") == "gpuhpc: spot interruption of (see Comment)"
    assert generic_reason("gpuhpc: instance local-el-spot1-abc is gone") == "gpuhpc: instance (see Comment) is gone"
    assert generic_reason("gpuhpc: stuck powering up (no instance was launched)") == \
        "gpuhpc: stuck powering up (no instance was launched)"


def test_node_to_pool_is_the_first_pool_that_lists_it():
    cfg = ElasticConfig(cluster="c", state_dir="/x", pools=(Pool("a", ("n1", "n2"), "x"), Pool("b", ("n2", "n3"), "x"),
                                                            Pool("a", ("n9",), "x")))
    assert [getattr(cfg.pool_of(n), "name", None) for n in ("n1", "n2", "n3", "n4")] == ["a", "a", "b", None]
    assert cfg.pool("a").nodes == ("n1", "n2") and cfg.nodes_expr == "n[1-3,9]"


def test_job_briefs_are_one_squeue_of_fields_without_free_text():
    argv = job_briefs_argv(["17", "18_3"])
    assert argv[:3] == ["squeue", "--noheader", "--states=all"] and "--jobs=17,18_3" in argv
    assert argv[-1].startswith("--Format=JobID:") and "Name" not in argv[-1]
    text = ("17      2     RUNNING     2026-12-03T03:06:25   2026-12-03T03:06:26   \n"
            "18_3    0     PENDING     2026-12-03T03:06:25   N/A   \n"
            "garbage line\n")
    got = parse_job_briefs(text)
    assert set(got) == {"17", "18_3"} and got["17"].restarts == 2 and got["18_3"].start is None
    assert got["17"].start - got["17"].submit == 1
