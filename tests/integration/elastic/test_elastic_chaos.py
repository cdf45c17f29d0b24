"""Chaos (issue 24): 20 checkpointing jobs on spot capacity with random reclaims, on a private
controller with the local provider (elastic_helpers.start_chaos_cluster: five powered-down spot
nodes of 4 CPUs). For ``GPUHPC_ELASTIC_CHAOS_SECONDS`` (default 150 s in CI; the issue's full run
is 600: ``GPUHPC_ELASTIC_CHAOS_SECONDS=600 pytest -s tests/integration/elastic/test_elastic_chaos.py``)
a random running instance is reclaimed every 10-30 s, half of them after an interruption notice
(drain, USR2: the jobs checkpoint) and half with none; slurmstepd and the jobs die first, then
slurmd. One orphan instance (an instance no node record names) appears mid-run. A reconciler pass
runs every 2 s (production: a one-minute timer). Then:

- the chaos happened: at least two reclaims (alternately after a notice and with none), each one
  journalled by the reconciler as that instance's end, each killing a job mid-run (the victim is a
  node running a job with at least ``LEFT`` steps to go); every job a reclaim killed ran again
  (another start in its log, Slurm's restart count), having lost at most one checkpoint interval;
  after a notice the killed jobs had checkpointed (USR2) before the kill;
- every job completes;
- the orphan was ended by the first reconciler pass after its grace, never before, and the ledger's
  orphan instance-seconds are the journal's;
- the ledger's instance report for the run: instance-hours split into boot, busy, idle, suspend
  and orphan that add up, priced at launch, spot savings against on-demand, and the jobs' run
  hours fit in the busy instance-hours x CPUs.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from decimal import Decimal

import pytest

from elastic_helpers import (CHAOS_CPUS, CHAOS_OD_PRICE, CHAOS_ORPHAN_GRACE, CHAOS_PRICE, CHAOS_SPOT,
                             start_chaos_cluster, stop_cluster)
from gpuhpc.elastic import journal
from gpuhpc.elastic.providers.base import TAG_CLUSTER, TAG_NODE, TAG_POOL, TAG_TOKEN
from gpuhpc.fsutil import write_atomic
from gpuhpc.ledger import db, instances
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]       # a private controller only

DURATION = int(os.environ.get("GPUHPC_ELASTIC_CHAOS_SECONDS") or 150)
JOBS, CHECKPOINT_EVERY = 20, 5
LEFT = 10             # a reclaim's victim runs a job with at least this many steps (seconds) to go
SEED = int(os.environ.get("GPUHPC_ELASTIC_CHAOS_SEED") or 24)


def _script(d, steps: int) -> str:
    ckpt, progress, log = d / "ckpt", d / "progress", d / "log"
    # the checkpoint and the progress count are replaced by rename, as a real checkpoint is: a reclaim
    # that kills the job between a truncate and its write left an empty file (CI read a start line
    # with no progress count)
    return f"""#!/bin/bash
put() {{ echo "$2" > "$1.tmp" && mv -f "$1.tmp" "$1"; }}
n=$(cat {ckpt} 2>/dev/null || echo 0)
echo "start $n $(cat {progress} 2>/dev/null || echo 0) $(date +%s.%N) $SLURMD_NODENAME" >> {log}
trap 'put {ckpt} $n; echo "usr2 $n" >> {log}' USR2
while [ $n -lt {steps} ]; do
  n=$((n + 1)); put {progress} $n; [ $((n % {CHECKPOINT_EVERY})) -eq 0 ] && put {ckpt} $n; sleep 1
done
echo "done $n $(date +%s.%N)" >> {log}
"""


class Reconciler(threading.Thread):
    """The timer's stand-in: a reconciler pass every 2 s; keeps when each pass began (``passes``)
    and every action it took, with its pass's start."""

    def __init__(self, el) -> None:
        super().__init__(daemon=True)
        self.el, self.stop_event, self.passes, self.actions, self.errors = el, threading.Event(), [], [], []

    def run(self) -> None:
        while not self.stop_event.wait(2):
            began = time.time()
            try:
                acts = self.el.reconcile()
            except Exception as exc:          # noqa: BLE001 - reported by the test
                self.errors.append(repr(exc))
                continue
            self.passes.append(began)
            self.actions += [(began, a) for a in acts]


def _orphan(el) -> tuple[str, subprocess.Popen, float]:
    """An instance of ours that no node record names: a live process with the provider's tags."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    iid, now = "local-orphan-chaos", time.time()
    rec = {"id": iid, "pid": proc.pid, "launched_at": now, "market": "spot",
           "tags": {TAG_CLUSTER: el.config.cluster, TAG_NODE: CHAOS_SPOT[-1], TAG_POOL: "spot", TAG_TOKEN: "chaos"}}
    el.provider.dir.mkdir(parents=True, exist_ok=True)
    write_atomic(el.provider.dir / f"{iid}.json", json.dumps(rec), mode=0o600)
    return iid, proc, now


def test_twenty_checkpointing_jobs_survive_random_spot_reclaims(tmp_path):
    rng = random.Random(SEED)
    steps = max(40, DURATION // 3)
    el = start_chaos_cluster(DURATION)
    rec = Reconciler(el)
    orphan_proc = None
    try:
        jobs = {}
        for i in range(JOBS):
            d = tmp_path / f"job{i:02d}"
            d.mkdir()
            jobs[el.client.submit_script(_script(d, steps), extra=[
                "--partition=spot", f"--job-name=gpuhpc-test-chaos-{i}", "--output=/dev/null", "--time=60",
                "--requeue", "--cpus-per-task=1"])] = d
        t0 = time.monotonic()
        el.mark(f"{JOBS} jobs of {steps} steps (checkpoint every {CHECKPOINT_EVERY}) submitted to spot; "
                f"chaos for {DURATION}s (seed {SEED})")
        rec.start()
        reclaims, killed, orphan = [], [], None          # killed: (reclaim no., job, its start lines then)
        next_at = t0 + rng.uniform(20, 40)

        def lines(job):
            log = jobs[job] / "log"
            return log.read_text().splitlines() if log.exists() else []

        def progress(job):
            p = jobs[job] / "progress"
            return int(p.read_text() or 0) if p.exists() else 0

        while time.monotonic() - t0 < DURATION:
            if orphan is None and time.monotonic() - t0 > DURATION / 3:
                orphan = _orphan(el)
                orphan_proc = orphan[1]
                el.mark(f"orphan instance {orphan[0]} appears (grace {CHAOS_ORPHAN_GRACE}s)")
            if time.monotonic() >= next_at:
                running = [r for r in el.client.queue() if r.job_id in jobs and r.state.state.value == "RUNNING"]
                busy = [i for i in el.provider.instances() if i.state == "running" and i.id != "local-orphan-chaos"
                        and any(r.nodelist == i.node and progress(r.job_id) <= steps - LEFT for r in running)]
                if busy:
                    victim = rng.choice(busy)
                    on_it = [r.job_id for r in running if r.nodelist == victim.node]
                    notice = len(reclaims) % 2 == 0          # half after a notice, half with none
                    if notice:
                        el.provider.interrupt(victim.id)
                        wait_for(lambda: "DRAIN" in el.state(victim.node), 10, f"{victim.node} drained on the notice")
                        # the notice's window (EC2: 2 min) ends once the jobs have checkpointed
                        wait_for(lambda: all(lines(j)[-1:] and lines(j)[-1].split()[0] in ("usr2", "done")
                                             for j in on_it), 20,
                                 lambda: f"the jobs on {victim.node} to checkpoint on USR2: "
                                         f"{ {j: lines(j)[-1:] for j in on_it} }")
                    el.provider.reclaim(victim.id)
                    reclaims.append((victim.node, victim.id, notice))
                    hit = [(len(reclaims), j, sum(x.startswith("start ") for x in lines(j))) for j in on_it
                           if not any(x.startswith("done ") for x in lines(j)[-1:])]
                    killed += hit
                    el.mark(f"reclaim {len(reclaims)}: {victim.node} ({'after a notice' if notice else 'no notice'}); "
                            f"jobs killed mid-run: {[j for _, j, _ in hit]}")
                next_at = time.monotonic() + rng.uniform(10, 30)
            time.sleep(0.5)
        el.mark(f"chaos over: {len(reclaims)} reclaims")

        def states():
            return {j: el.job(j).get("JobState", "") for j in jobs}
        left = wait_for(lambda: all(s == "COMPLETED" for s in states().values()), steps + 240,
                        lambda: f"every job to complete (now {states()})")
        t_done = el.mark(f"all {JOBS} jobs COMPLETED ({left})")
        rec.stop_event.set()
        rec.join(30)
        assert not rec.errors, rec.errors

        # the chaos happened: reclaims of both kinds, each seen by the reconciler (the instance's
        # end in the journal, its node set DOWN) and each killing at least one job mid-run
        assert len(reclaims) >= 2 and {n for _, _, n in reclaims} == {True, False}, reclaims
        ours = {i for _, i, _ in reclaims}
        ends = [e["id"] for e in journal.read(el.config.state_dir) if e["event"] == "end" and e["id"] in ours
                and e["reason"] == "gone"]                  # found gone by the reconciler (not ended by it)
        assert sorted(ends) == sorted(ours) and len(ours) == len(reclaims), (ends, reclaims)
        downs = {(a.target, a.reason) for _, a in rec.actions if a.kind == "down"}
        assert all((n, f"gpuhpc: instance {i} is gone") in downs for n, i, _ in reclaims), (downs, reclaims)
        assert sorted({k for k, _, _ in killed}) == list(range(1, len(reclaims) + 1)), (killed, reclaims)
        # every job a reclaim killed ran again (its log's next start; Slurm counted the requeue)
        restarts_slurm = {j: int(el.job(j).get("Restarts", "0")) for j in jobs}
        for k, job, starts_then in killed:
            starts_now = sum(x.startswith("start ") for x in lines(job))
            assert starts_now > starts_then, (k, job, lines(job))
            assert restarts_slurm[job] >= sum(j == job for _, j, _ in killed), (job, restarts_slurm[job], killed)
        # after a notice the killed jobs had checkpointed: their run's last line before the kill was usr2
        for k, job, starts_then in killed:
            if reclaims[k - 1][2] and starts_then:
                run = lines(job)
                at = [i for i, x in enumerate(run) if x.startswith("start ")][starts_then - 1]
                nxt = [i for i, x in enumerate(run) if x.startswith("start ")][starts_then]
                assert any(x.startswith("usr2 ") for x in run[at:nxt]), (k, job, run)

        # at most one checkpoint interval lost at every restart
        restarts = lost_max = 0
        run_steps = 0
        for job, d in jobs.items():
            lines_ = (d / "log").read_text().splitlines()
            assert lines_[-1].startswith(f"done {steps}"), (job, lines_)
            starts = [line.split() for line in lines_ if line.startswith("start ")]
            restarts += len(starts) - 1
            for s in starts[1:]:
                ckpt, before = int(s[1]), int(s[2])
                assert 0 <= before - ckpt <= CHECKPOINT_EVERY, (job, lines_)
                lost_max = max(lost_max, before - ckpt)
            run_steps += steps + sum(int(s[2]) - int(s[1]) for s in starts[1:])
        assert restarts >= len({j for _, j, _ in killed}), (restarts, killed)
        # the orphan: ended by the first reconciler pass after its grace, never before
        ended = [(t, a) for t, a in rec.actions if a.kind == "terminate" and a.target == "local-orphan-chaos"]
        assert orphan is not None and len(ended) == 1, ended
        born, by = orphan[2], ended[0][0]
        assert not [t for t in rec.passes if born + CHAOS_ORPHAN_GRACE <= t < by], \
            ("a pass after the grace kept the orphan", born, by, rec.passes)
        assert orphan_proc.wait(10) is not None
        events = journal.read(el.config.state_dir)
        orphan_ends = [e for e in events if e.get("orphan")]
        assert [e["id"] for e in orphan_ends] == ["local-orphan-chaos"]
        orphan_s = orphan_ends[0]["at"] - orphan_ends[0]["launched_at"]
        assert orphan_ends[0]["launched_at"] == born and orphan_s >= CHAOS_ORPHAN_GRACE, orphan_ends   # never before

        # the cost report of the run: instance-hours and their parts
        wait_for(lambda: not el.provider.instances(), 150, "every instance to end after the run (SuspendTime)")
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        db.upgrade(url)
        instances.ingest(journal.read(el.config.state_dir), url)
        rep = instances.instance_report(url=url)
        (row,) = rep.rows
        tot = instances.totals(rep.rows)
        parts = {p: tot[f"{p}_hours"] for p in instances.PARTS}
        assert abs(sum(parts.values()) - tot["instance_hours"]) < Decimal("0.000001")
        assert row.market == "spot" and tot["spot_savings"] > 0
        expect = tot["instance_hours"] * (Decimal(CHAOS_OD_PRICE) - Decimal(CHAOS_PRICE))
        assert abs(tot["spot_savings"] - expect) < Decimal("0.0001")
        assert abs(parts["orphan"] * 3600 - Decimal(repr(orphan_s))) < Decimal("0.01")     # the journal's
        job_hours = Decimal(run_steps) / 3600          # one CPU per job, a step a second
        assert job_hours <= (parts["busy"] + parts["idle"]) * CHAOS_CPUS, (job_hours, parts)
        print(f"chaos {DURATION}s: {JOBS} jobs of {steps} steps all COMPLETED {t_done:.0f}s after submit; "
              f"{len(reclaims)} reclaims ({sum(n for _, _, n in reclaims)} after a notice) killing {len(killed)} jobs "
              f"mid-run, {restarts} restarts, "
              f"at most {lost_max} steps lost (interval {CHECKPOINT_EVERY}); orphan ended after {orphan_s:.1f}s "
              f"(grace {CHAOS_ORPHAN_GRACE}s)")
        print("instances: " + ", ".join(f"{k} {float(v):.4f}h" for k, v in parts.items())
              + f"; total {float(tot['instance_hours']):.4f} instance-h, cost {float(tot['cost']):.4f}, "
              f"spot savings {float(tot['spot_savings']):.4f}; jobs' run hours {float(job_hours):.4f} "
              f"(GPU-hours 0: CPU-only nodes) on {len(CHAOS_SPOT)} nodes x {CHAOS_CPUS} CPUs")
        print(f"slowest Slurm commands: {dict(sorted(el.runner.slowest.items()))}")
    finally:
        rec.stop_event.set()
        if orphan_proc is not None and orphan_proc.poll() is None:
            os.killpg(orphan_proc.pid, signal.SIGKILL)
            orphan_proc.wait(5)
        stop_cluster(el)
