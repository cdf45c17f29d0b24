#!/usr/bin/env python3
"""Benchmark: elastic capacity at cloud scale (issue 38.3; figures in docs/elastic.md).

1. The reconciler pass (``gpuhpc power reconcile``): ``reconcile_once`` whole (read nodes and
   instances, the state file under its lock, decide, apply the node updates, write the state and the
   journal) over a stand-in Slurm that answers ``scontrol --oneliner show node`` text as Slurm prints
   it and counts every command, and a stand-in provider: 10,000 cloud nodes and instances in the mix
   a busy cluster has (running and recorded, gone, orphans past and within their grace, spot
   notices, a pool whose cooldown ended). Best of N, with two baselines in the same run: the same
   pass at a tenth of the nodes (per-node cost: 1.0 is linear) and parsing the node text and joining
   instances by name (the least any reconciler must do). Goal: <= 2 s at 10,000.
2. A launch of 2,000 nodes asked for at once (``--launch``), against moto's EC2 in this process:
   the resume program's plans (one per job of a Slurm resume file), the worker's launches, a
   simulated registration (each instance reads its node name from its tag, as its user data does,
   and the node goes up), then one reconciler pass that must find everything in line. Printed: the
   wall time of gpuhpc's own work (everything but the time inside moto's calls, which stands for
   EC2's), the time inside moto, and EC2 API calls per node by operation. Goal: ParallelCluster's
   10 minutes for the launch. Then the same launch with each EC2 call taking ``--ec2-latency``
   seconds (slept before moto answers) and the worker's ``--at-once`` launches side by side: the
   wall time a real launch wave would take.
3. Unless --no-cluster: submit -> running on a cold node against the emulated boot time, on the
   private controller of tests/integration/elastic (its own ports; the local provider waits
   --boot seconds before it starts the node's slurmd): the difference is what gpuhpc and Slurm add.

    .venv/bin/python bench/elastic.py [--nodes 10000] [--repeat 3] [--launch 2000] [--ec2-latency 1]
                                      [--at-once 16] [--boot 2] [--no-cluster]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuhpc import hostlist  # noqa: E402
from gpuhpc.elastic.config import ElasticConfig, Pool  # noqa: E402
from gpuhpc.elastic.providers.base import Instance  # noqa: E402
from gpuhpc.elastic.reconcile import reconcile_once  # noqa: E402
from gpuhpc.elastic.store import NodeRecord, Store  # noqa: E402
from gpuhpc.slurm.parsers import parse_oneliner_records, parse_ping  # noqa: E402
from gpuhpc.slurm.power import JobBrief, PowerNode, parse_power_nodes  # noqa: E402

HOST = "benchctl"


class StandInSlurm:
    """What the reconciler asks of Slurm, answered from text and tables; every command counted."""

    def __init__(self, text: str, jobs: dict[str, str]):
        self.text, self.jobs, self.commands = text, jobs, Counter()     # jobs: node -> job id
        self.node_list: list[PowerNode] | None = None

    def controllers(self):
        self.commands["scontrol ping"] += 1
        return parse_ping(f"Slurmctld(primary) at {HOST} is UP\n")

    def nodes(self, names=None):
        self.commands["scontrol show node"] += 1
        return self.node_list if self.node_list is not None else parse_power_nodes(self.text)

    def jobs_on(self, nodes):
        self.commands["squeue -w"] += 1
        return [(job, node) for node, job in self.jobs.items()]

    def job_briefs(self, ids):
        self.commands["squeue --jobs"] += 1
        return {j: JobBrief(j, 0, "RUNNING", 1.0, 2.0) for j in ids}

    def __getattr__(self, name):            # down, drain, power_down, resume, update, signal_job, hold_job
        def call(*a, **kw):
            self.commands[name] += 1
            return True
        return call


class StandInProvider:
    def __init__(self, instances):
        self.live, self.calls = instances, Counter()

    def instances(self):
        self.calls["instances"] += 1
        return self.live

    def terminate(self, ids):
        self.calls["terminate"] += 1
        return ids


def inventory(n: int, now: float, state_dir: str):
    names = [f"spot{i:05d}" for i in range(n)]
    pools = (Pool("spot", tuple(names[: n // 2]), "bench", market="spot", boot_timeout=300, capacity_cooldown=600),
             Pool("od", tuple(names[n // 2:]), "bench", boot_timeout=300, price_tier=2))
    cfg = ElasticConfig(cluster="bench", pools=pools, state_dir=state_dir, orphan_grace=600, resume_timeout=330)
    lines, instances, jobs, store = [], [], {}, Store(state_dir)
    with store.update() as state:
        for i, name in enumerate(names):
            kind = i % 10
            st = ("ALLOCATED+CLOUD" if kind < 6 else "IDLE+CLOUD+POWERED_DOWN" if kind < 8
                  else "DOWN+CLOUD+POWERED_DOWN" if kind == 8 else "MIXED+CLOUD")
            reason = "gpuhpc cooldown InsufficientInstanceCapacity pool spot until 10:00:00" if kind == 8 else "(null)"
            lines.append(f"NodeName={name} Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUEfctv=192 CPUTot=192 "
                         f"CPULoad=1.00 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8 "
                         f"NodeAddr={name} NodeHostName={name} Version=22.05.8 RealMemory=1900000 AllocMem=0 "
                         f"State={st} ThreadsPerCore=2 Partitions=spot Comment=gpuhpc instance i-{i:08x} "
                         f"pool spot type p5.48xlarge Reason={reason}")
            if kind in (0, 1, 2, 3, 4, 9):        # recorded and running; 9: interrupted
                state.nodes[name] = NodeRecord(name, "spot", f"t{i}", now - 3600, f"i-{i:08x}", now - 3600,
                                               job_started=True)
                instances.append(Instance(f"i-{i:08x}", name, "spot", "running", now - 3600,
                                          interrupted_at=now - 5 if kind == 9 else None))
            elif kind == 5:                       # recorded, instance gone (listed as terminated)
                state.nodes[name] = NodeRecord(name, "spot", f"t{i}", now - 3600, f"i-{i:08x}", now - 3600,
                                               job_started=True)
                instances.append(Instance(f"i-{i:08x}", name, "spot", "terminated", now - 3600))
            elif kind in (6, 7, 8):               # orphans: past and within their grace
                instances.append(Instance(f"i-o{i:07x}", name, "od", "running", now - (900 if kind == 6 else 60)))
            if kind in (5, 9):
                jobs[name] = str(1000 + i)
        state.cooldowns["spot"] = {"until": now - 1, "code": "InsufficientInstanceCapacity"}
    return cfg, "\n".join(lines) + "\n", instances, jobs, store


def best(fn, repeat: int, setup=lambda: None) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        setup()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def reconcile_bench(n: int, repeat: int, profile: bool = False) -> tuple[float, list, Counter, float]:
    """(best pass time, the pass's actions, its Slurm commands, the parse-and-join baseline)."""
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="gpuhpc-bench-elastic-", dir="/var/tmp") as d:
        cfg, text, instances, jobs, store = inventory(n, now, d)
        saved = store.path.read_text()
        slurm, provider = StandInSlurm(text, jobs), StandInProvider(instances)

        def reset():
            store.path.write_text(saved)
            Path(d, "instances.jsonl").unlink(missing_ok=True)
            slurm.commands.clear()
            # a fresh config each pass: nothing cached from the last one
            reset.cfg = ElasticConfig(cluster=cfg.cluster, pools=cfg.pools, state_dir=cfg.state_dir,
                                      orphan_grace=cfg.orphan_grace, resume_timeout=cfg.resume_timeout)

        def one_pass():
            return reconcile_once(reset.cfg, slurm, {"bench": provider}, now=now, host=HOST)

        def baseline():
            recs = parse_oneliner_records(text)
            by_name = {r["NodeName"]: r for r in recs}
            return sum(1 for i in instances if i.node in by_name)

        if profile:
            import cProfile
            import pstats

            reset()
            cProfile.runctx("one_pass()", globals(), {"one_pass": one_pass}, "/tmp/gpuhpc-bench-elastic.prof")
            pstats.Stats("/tmp/gpuhpc-bench-elastic.prof").sort_stats("cumtime").print_stats(25)
        t_pass, acts = best(one_pass, repeat, reset)
        commands = Counter(slurm.commands)
        t_base, _ = best(baseline, repeat)
    return t_pass, acts, commands, t_base


class TimedEc2:
    """moto's EC2 client with every call counted and timed: the time inside stands for EC2's."""

    def __init__(self, client, latency: float = 0.0):
        self.client, self.calls, self.inside, self.latency = client, Counter(), 0.0, latency

    def __getattr__(self, op):
        fn = getattr(self.client, op)

        def call(**kw):
            self.calls[op] += 1
            t = time.perf_counter()
            try:
                if self.latency:               # EC2's own time per call, stood in for (moto answers at once)
                    time.sleep(self.latency)
                return fn(**kw)
            finally:
                self.inside += time.perf_counter() - t
        return call


class StandInCluster(StandInSlurm):
    """Slurm for the launch bench: the cloud nodes' table, changed by the worker's updates (Comment,
    NodeAddr) and by :meth:`register` (a node's slurmd reached the controller)."""

    def __init__(self, names):
        super().__init__("", {})
        self.table = {n: PowerNode(n, "IDLE+CLOUD+POWERING_UP") for n in names}
        self.node_list = None

    def nodes(self, names=None):
        self.commands["scontrol show node"] += 1
        return list(self.table.values())

    def jobs_on(self, nodes):
        self.commands["squeue -w"] += 1
        return []

    def update(self, node, **fields):
        self.commands["scontrol update"] += 1
        cur = self.table[node]
        self.table[node] = PowerNode(node, cur.state, cur.reason, fields.get("Comment", cur.comment))
        return True

    def register(self, node):
        cur = self.table[node]
        self.table[node] = PowerNode(node, "ALLOCATED+CLOUD", cur.reason, cur.comment, slurmd_start=time.time())


def launch_bench(n: int, latency: float = 0.0, at_once: int = 1) -> None:
    """``n`` nodes asked for at once against moto: plans, launches, registration, a pass, clean-up."""
    import boto3
    from moto import mock_aws

    from gpuhpc.elastic import worker
    from gpuhpc.elastic.power import resume_plans
    from gpuhpc.elastic.providers.base import TAG_CLUSTER, TAG_NODE
    from gpuhpc.elastic.providers.ec2 import Ec2Provider

    names = [f"gpu{i:05d}" for i in range(n)]
    # the jobs: 8-node and 4-node jobs, a tenth of the nodes single-node jobs (Slurm 22.05's resume file)
    jobs, i, job_id = [], 0, 5000
    while i < n:
        size = 1 if i >= n * 9 // 10 else (8 if (i // 8) % 2 == 0 else 4)
        jobs.append({"job_id": job_id, "nodes": hostlist.compress(names[i:i + size])})
        i, job_id = i + size, job_id + 1
    resume_text = json.dumps({"jobs": jobs, "all_nodes": hostlist.compress(names)})
    # moto looks an instance's tags up by scanning every tag of the account (a describe of n
    # instances costs n^2): index them, so that moto's own cost does not bury gpuhpc's at 2,000
    from moto.ec2.models import core as moto_core
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    def indexed_tags(self):
        tags = self.ec2_backend.tags.get(self.id, {}) if self.id else {}
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(self.id), "") if self.id else ""
        return [{"resource_id": self.id, "key": k, "value": v, "resource_type": kind} for k, v in tags.items()]

    moto_core.TaggedEC2Resource.get_tags = indexed_tags
    with mock_aws(), tempfile.TemporaryDirectory(prefix="gpuhpc-bench-launch-", dir="/var/tmp") as d:
        raw = boto3.client("ec2", region_name="us-east-1")
        ami = raw.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
        raw.create_launch_template(LaunchTemplateName="gpuhpc-node", LaunchTemplateData={"ImageId": ami})
        ec2 = TimedEc2(raw, latency)
        cfg = ElasticConfig(cluster="benchlaunch", state_dir=d, orphan_grace=600, resume_timeout=600,
                            pools=(Pool("gpu", tuple(names), "aws", instance_types=("p5.48xlarge", "p5e.48xlarge"),
                                        max_nodes=n),))
        provider = Ec2Provider(cfg.cluster, ec2, launch_template="gpuhpc-node", sleep=lambda s: None)
        worker.provider_for = lambda name, config: provider          # the bench's timed client
        slurm = StandInCluster(names)
        store = Store(d)
        t0 = time.perf_counter()
        plans = resume_plans(cfg, names, resume_text, store, time.time())
        t_plans = time.perf_counter() - t0
        worker.run_plans(cfg, plans, slurm, at_once=at_once)
        t_launch = time.perf_counter() - t0
        inside_launch, launch_calls = ec2.inside, Counter(ec2.calls)
        # registration: each instance's user data reads its node name from its tag and starts slurmd
        seen = [i for page in raw.get_paginator("describe_instances").paginate(
                    Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cfg.cluster]}])
                for r in page["Reservations"] for i in r["Instances"]]
        for inst in seen:
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
            slurm.register(tags[TAG_NODE])
        t1 = time.perf_counter()
        inside0 = ec2.inside
        acts = reconcile_once(cfg, slurm, {"aws": provider}, host=HOST)
        t_pass, inside_pass = time.perf_counter() - t1, ec2.inside - inside0
        recorded = sum(1 for r in store.read().nodes.values() if r.instance_id)
        registered = sum(1 for x in slurm.table.values() if "ALLOCATED" in x.state)
        ends = [a for a in acts if a.kind in ("terminate", "down")]
        # clean-up: nothing of the bench's cluster left
        provider.terminate([r.instance_id for r in store.read().nodes.values() if r.instance_id])
        left = provider.instances()
    if at_once > 1 or latency:
        print(f"launch: {n} nodes, {len(plans)} launches, {at_once} at once, EC2 stood in for at {latency:.2f} s a "
              f"call: wall {t_launch:.1f} s ({sum(launch_calls.values())} calls, {inside_launch:.1f} s inside them "
              f"in all); {len(seen)} instances, {registered} registered, {recorded} recorded, {len(left)} left")
        return
    own = t_launch - inside_launch
    print(f"launch: {n} nodes asked for at once ({len(jobs)} jobs, {len(plans)} launches): "
          f"{len(seen)} instances, {registered} registered, {recorded} recorded; "
          f"pass after: {len(acts)} actions ({len(ends)} ends/downs), {len(left)} instances left after clean-up")
    print(f"  gpuhpc's own work: {own:.1f} s (plans {t_plans:.2f} s) for the launch "
          f"(goal: ParallelCluster's 600 s: {'met' if own <= 600 else 'MISSED'}), pass {t_pass - inside_pass:.2f} s; "
          f"inside moto (EC2's stand-in) {inside_launch:.1f} s + {inside_pass:.1f} s")
    per = ", ".join(f"{op} {c / n:.3f}" for op, c in sorted(launch_calls.items()))
    print(f"  EC2 calls per node: {sum(launch_calls.values()) / n:.2f} ({per}); "
          f"Slurm commands: " + ", ".join(f"{k} {v}" for k, v in sorted(slurm.commands.items())))



def cold_node(boot: float) -> None:
    """Submit one job to the powered-down spot pool; time resume, registration and RUNNING."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration" / "elastic")]
    from elastic_helpers import start_cluster, stop_cluster

    el = start_cluster()
    try:
        el.faults({"spot": {"mode": "slow_boot", "seconds": boot}})
        t0 = time.monotonic()
        job = el.submit("spot", seconds=1)
        seen: dict[str, float] = {}
        deadline = t0 + 180
        while time.monotonic() < deadline and "running" not in seen:
            state = el.state("el-spot1")
            now = time.monotonic() - t0
            if "POWERING_UP" in state:
                seen.setdefault("resume", now)
            if "resume" in seen and "NOT_RESPONDING" not in state and "POWERED_DOWN" not in state:
                seen.setdefault("registered", now)
            if el.job(job).get("JobState") in ("RUNNING", "COMPLETED"):
                seen["running"] = now
            time.sleep(0.2)
    finally:
        stop_cluster(el)
    if "running" not in seen:
        print(f"cold node: job did not run within 180 s ({seen})")
        return
    print(f"cold node: submit -> POWERING_UP {seen.get('resume', float('nan')):.1f} s, -> slurmd registered "
          f"{seen.get('registered', float('nan')):.1f} s, -> RUNNING {seen['running']:.1f} s; emulated boot "
          f"{boot:.1f} s: overhead {seen['running'] - boot:.1f} s, ratio {seen['running'] / boot:.1f}x "
          "(Slurm 22.05 starts a job on a resumed node on a periodic timer, up to 30 s after registration)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--launch", type=int, default=2000, help="nodes asked for at once against moto (0: skip)")
    ap.add_argument("--boot", type=float, default=2.0, help="emulated boot time of a cold node (s)")
    ap.add_argument("--profile", action="store_true", help="cProfile one reconciler pass")
    ap.add_argument("--ec2-latency", type=float, default=1.0,
                    help="seconds each EC2 call takes, for the second launch run (0: skip it)")
    ap.add_argument("--at-once", type=int, default=16, help="the worker's launches side by side in that run")
    ap.add_argument("--no-cluster", action="store_true", help="skip the cold-node measurement")
    args = ap.parse_args()
    if args.nodes:
        t_pass, acts, commands, t_base = reconcile_bench(args.nodes, args.repeat, args.profile)
        small = max(args.nodes // 10, 10)
        t_small, _, _, _ = reconcile_bench(small, args.repeat)
        kinds = Counter(a.kind for a in acts)
        print(f"reconciler pass: {args.nodes} nodes, instances as many: {t_pass * 1000:.0f} ms "
              f"(goal <= 2000 ms: {'met' if t_pass <= 2 else 'MISSED'})")
        print(f"  per node: {t_pass / args.nodes * 1e6:.0f} us at {args.nodes}, {t_small / small * 1e6:.0f} us at "
              f"{small}: ratio {(t_pass / args.nodes) / (t_small / small):.2f} (1.0: linear)")
        print(f"  baseline (parse the node text, join instances by name): {t_base * 1000:.0f} ms; "
              f"ratio {t_pass / t_base:.2f}x")
        print("  actions: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        print("  Slurm commands: " + ", ".join(f"{k} {v}" for k, v in sorted(commands.items())))
    if args.launch:
        launch_bench(args.launch)                    # one launch after another: gpuhpc's own time
        if args.ec2_latency:                         # side by side, EC2's latency stood in for: the wall time
            launch_bench(args.launch, args.ec2_latency, args.at_once)
    if not args.no_cluster:
        cold_node(args.boot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
